# FlashNPC sync protocol client for Godot 3, written from docs/protocol.md alone.
#
# JSON over WebSocket text frames (Godot's built-in JSON; msgpack would need a plugin).
# Copy this file and flashnpc_ws.gd into a project and use it from any node:
#
#     var Sync = preload("res://flashnpc_sync.gd")
#     var sync = Sync.new()
#     sync.connect("npc_changed", self, "_on_npc_changed")
#     sync.start("ws://127.0.0.1:8765", token_from_your_backend, Vector2(10, 20))
#     func _process(delta): sync.poll(delta)              # every frame
#     sync.send_intent(Vector2(12, 20))                  # a move
#     sync.send_intent(null, ["bram", "greet"])          # a talk
#
# It keeps a replica of the NPCs near the player (`npcs`: id -> {"pos": [x, y], "state": {}}),
# follows deltas in seq order (a gap asks for a resync), keeps every intent until it is
# acknowledged, reconnects with exponential backoff and full jitter, and resumes with
# {epoch, seq} plus the unacknowledged intents.
extends Reference

const Ws = preload("flashnpc_ws.gd")

signal synced()                                   # a snapshot, or a resume with nothing missed
signal npc_changed(kind, npc_id, key, value)      # kind: enter, leave, set, move, reset
signal acknowledged(cseq)                         # every intent <= cseq is processed and saved
signal refused(cseq, rule, reason)                # an intent the server did not apply
signal server_error(code, reason)                 # sent before the server closes

const FATAL = ["auth_failed", "unsupported_version", "replaced"]

var url = ""
var token = ""              # set a fresh one here before a reconnect once it expires
var position = null         # Vector2: where the player is (the server's word wins)
var npcs = {}
var epoch = null
var seq = -1
var radius = 0.0
var tick_hz = 0.0
var cseq = 0
var acked = 0
var unacked = []            # intent messages not yet acknowledged, in cseq order
var is_synced = false
var stopped = false
var last_error = null       # [code, reason]
# counters
var connects = 0
var snapshots = 0
var deltas = 0
var resumes = 0
var gaps = 0

var _ws = null
var _awaiting_snapshot = false
var _resuming = false
var _attempt = 0
var _retry_in = -1.0
var _rng = RandomNumberGenerator.new()


func start(p_url, p_token, p_position = null):
	url = p_url
	token = p_token
	position = p_position
	_rng.randomize()
	_connect()


func poll(delta):
	if _ws != null:
		_ws.poll()
	if _retry_in >= 0.0 and not stopped:
		_retry_in -= delta
		if _retry_in < 0.0:
			_connect()


func send_intent(pos = null, talk = null):
	cseq += 1
	var msg = {"t": "intent", "cseq": cseq}
	if pos != null:
		msg["pos"] = [pos.x, pos.y]
		position = pos
	if talk != null:
		msg["talk"] = {"npc": talk[0], "intent": talk[1]}
	unacked.append(msg)
	if is_connected_now():
		_ws.send(msg)
	return cseq


func is_connected_now():
	return _ws != null and _ws.is_open


func drop_connection():
	# close the socket without bye: the server keeps the session for a resume
	if _ws != null:
		_ws.close(1000, "dropped")


func close():
	stopped = true
	if is_connected_now():
		_ws.send({"t": "bye"})
	if _ws != null:
		_ws.close(1000, "bye")


# ---- connection --------------------------------------------------------------------------

func _connect():
	_retry_in = -1.0
	_ws = Ws.new()
	_ws.connect("opened", self, "_on_open")
	_ws.connect("message", self, "_handle")
	_ws.connect("closed", self, "_on_closed")
	_ws.open(url)


func _on_open():
	connects += 1
	var hello = {"t": "hello", "v": 1, "token": token}
	if epoch != null:
		hello["resume"] = {"epoch": epoch, "seq": seq}
		_resuming = true
	if position != null:
		hello["pos"] = [position.x, position.y]
	_ws.send(hello)
	for msg in unacked:  # the server handles them after the hello, in order
		_ws.send(msg)


func _on_closed():
	is_synced = false
	if stopped or _retry_in >= 0.0:
		return
	_retry_in = _rng.randf_range(0.0, min(10.0, 0.2 * pow(2.0, _attempt)))
	_attempt += 1


# ---- messages ----------------------------------------------------------------------------

func _handle(msg):
	var t = msg["t"]
	if t == "snapshot":
		_snapshot(msg)
	elif t == "delta":
		if msg.has("ack"):
			_on_ack(int(msg["ack"]))
		_delta(msg)
	elif t == "ack":
		if epoch != null and not _awaiting_snapshot:
			if _resuming:
				resumes += 1
				_resuming = false
			_became_synced()
		_on_ack(int(msg["cseq"]))
	elif t == "refused":
		var n = int(msg["cseq"])
		for i in range(unacked.size()):
			if int(unacked[i]["cseq"]) == n:
				unacked.remove(i)
				break
		if msg.has("pos"):
			_server_moved(msg["pos"])
		emit_signal("refused", n, msg["rule"], msg["reason"])
	elif t == "error":
		last_error = [msg["code"], msg["reason"]]
		if msg["code"] in FATAL:
			stopped = true
		emit_signal("server_error", msg["code"], msg["reason"])
	elif t == "bye":
		last_error = ["bye", msg.get("reason", "")]


func _snapshot(msg):
	epoch = msg["epoch"]
	seq = int(msg["seq"])
	radius = msg["radius"]
	tick_hz = msg["tick_hz"]
	npcs = {}
	for id in msg["npcs"]:
		var e = msg["npcs"][id]
		npcs[id] = {"pos": e["pos"].duplicate(), "state": e["state"].duplicate()}
	_awaiting_snapshot = false
	_resuming = false
	snapshots += 1
	_server_moved(msg["pos"])
	emit_signal("npc_changed", "reset", "", "", null)
	for id in npcs:
		emit_signal("npc_changed", "enter", id, "", null)
	_became_synced()


func _delta(msg):
	if epoch == null or int(msg["seq"]) != seq + 1:
		if not _awaiting_snapshot:  # a gap: do not apply, ask for a snapshot
			gaps += 1
			_awaiting_snapshot = true
			is_synced = false
			_ws.send({"t": "resync", "seq": seq})
		return
	seq = int(msg["seq"])
	deltas += 1
	if _resuming:  # the missed deltas are coming: resumed without a snapshot
		resumes += 1
		_resuming = false
	for id in msg.get("leave", []):
		if npcs.has(id):
			npcs.erase(id)
			emit_signal("npc_changed", "leave", id, "", null)
	var enter = msg.get("enter", {})
	for id in enter:
		npcs[id] = {"pos": enter[id]["pos"].duplicate(), "state": enter[id]["state"].duplicate()}
		emit_signal("npc_changed", "enter", id, "", null)
	var sets = msg.get("set", {})
	for id in sets:
		if npcs.has(id):
			for key in sets[id]:
				npcs[id]["state"][key] = sets[id][key]  # null is a value, not a deletion
				emit_signal("npc_changed", "set", id, key, sets[id][key])
	var moves = msg.get("move", {})
	for id in moves:
		if npcs.has(id):
			npcs[id]["pos"] = moves[id].duplicate()
			emit_signal("npc_changed", "move", id, "", moves[id])
	if msg.has("pos"):  # the server moved the player (an admin move)
		_server_moved(msg["pos"])
	_became_synced()


func _became_synced():
	_attempt = 0
	if not is_synced:
		is_synced = true
		emit_signal("synced")


func _server_moved(pos):
	for m in unacked:
		if m.has("pos"):
			return  # a move of ours is still on its way: it will put us there
	position = Vector2(pos[0], pos[1])


func _on_ack(n):
	if n <= acked:
		return
	acked = n
	while unacked.size() > 0 and int(unacked[0]["cseq"]) <= n:
		unacked.pop_front()
	emit_signal("acknowledged", n)
