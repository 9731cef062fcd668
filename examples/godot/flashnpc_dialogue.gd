# FlashNPC dialogue protocol client for Godot 3, written from docs/protocol.md alone.
#
# NPC lines from `flashnpc serve --dialogue` for a game that does not run the model itself.
# JSON over WebSocket text frames; copy this file and flashnpc_ws.gd into a project. Every request carries a `rid`; its one final answer comes
# back as a signal with the same rid.
#
#     var Dialogue = preload("res://flashnpc_dialogue.gd")
#     var d = Dialogue.new()
#     d.connect("line", self, "_on_line")          # (rid, text, fallback, msg)
#     d.connect("piece", self, "_on_piece")        # (rid, text): streamed text
#     d.start("ws://127.0.0.1:8767", token)
#     func _process(delta): d.poll()
#     var rid = d.open_session("guard", "idle")    # -> signal session(rid, session_id)
#     d.request_line(session_id, "greet", true)    # streamed
extends Reference

const Ws = preload("flashnpc_ws.gd")

signal welcome(player)
signal session(rid, session_id)
signal piece(rid, text)
signal line(rid, text, fallback, msg)
signal ok(rid)
signal busy(rid, retry_after_ms)
signal request_error(rid, code, reason)           # one request failed; the connection stays
signal server_error(code, reason)                 # fatal: the server closes next
signal closed()

var player = null
var is_open = false
var last_error = null
var _ws = Ws.new()
var _next_rid = 0


func start(url, token):
	_ws.connect("opened", self, "_on_open", [token])
	_ws.connect("message", self, "_handle")
	_ws.connect("closed", self, "_on_closed")
	return _ws.open(url)


func poll():
	_ws.poll()


func open_session(archetype, state, persona = [], context = {}):
	var msg = {"t": "open_session", "rid": _rid(), "archetype": archetype, "state": state}
	if persona.size() > 0:
		msg["persona"] = persona
	if context.size() > 0:
		msg["context"] = context
	return _request(msg)


func request_line(session_id, intent, stream = false, max_tokens = 0, p_seed = -1):
	var msg = {"t": "request_line", "rid": _rid(), "session": session_id, "intent": intent,
			"stream": stream}
	if max_tokens > 0:
		msg["max_tokens"] = max_tokens
	if p_seed >= 0:
		msg["seed"] = p_seed
	return _request(msg)


func update_state(session_id, state):
	return _request({"t": "update_state", "rid": _rid(), "session": session_id, "state": state})


func close_session(session_id):
	return _request({"t": "close_session", "rid": _rid(), "session": session_id})


func cancel(rid):
	# the request_line `rid` is answered request_error(rid, "cancelled", ...) at once
	_ws.send({"t": "cancel", "rid": rid})


func bye():
	_ws.send({"t": "bye"})


func _rid():
	_next_rid += 1
	return _next_rid


func _request(msg):
	_ws.send(msg)
	return msg["rid"]


func _on_open(token):
	is_open = true
	_ws.send({"t": "hello", "v": 1, "token": token})


func _on_closed():
	is_open = false
	emit_signal("closed")


func _handle(msg):
	var t = msg["t"]
	var rid = int(msg.get("rid", 0))
	if t == "welcome":
		player = msg["player"]
		emit_signal("welcome", player)
	elif t == "session":
		emit_signal("session", rid, msg["session"])
	elif t == "piece":
		emit_signal("piece", rid, msg["text"])
	elif t == "line":
		emit_signal("line", rid, msg["text"], msg["fallback"], msg)
	elif t == "ok":
		emit_signal("ok", rid)
	elif t == "busy":
		emit_signal("busy", rid, int(msg["retry_after_ms"]))
	elif t == "error" and msg.has("rid"):
		emit_signal("request_error", rid, msg["code"], msg["reason"])
	elif t == "error":
		last_error = [msg["code"], msg["reason"]]
		emit_signal("server_error", msg["code"], msg["reason"])
