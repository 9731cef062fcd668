# Headless check of flashnpc_dialogue.gd against a running `flashnpc serve --dialogue`:
#
#   godot3-server --no-window --path examples/godot -s check_dialogue.gd \
#       --url=ws://127.0.0.1:8767 --token=JWT --archetype=guard --state=idle --intent=greet
#
# Opens a session, streams a line (its pieces must add up to the line unless it is an
# authored fallback), cancels a second request, closes the session and says bye. Prints one
# line `RESULT {json}` and exits 0 when every check passed, 1 otherwise.
extends "res://check_base.gd"

const Dialogue = preload("res://flashnpc_dialogue.gd")

var d = null
var answers = {}     # rid -> [kind, payload]
var pieces = {}      # rid -> [text, ...]
var welcomed = false
var _want = 0


func _on_welcome(_player):
	welcomed = true


func _on_session(rid, session_id):
	answers[rid] = ["session", session_id]


func _on_piece(rid, text):
	if not pieces.has(rid):
		pieces[rid] = []
	pieces[rid].append(text)


func _on_line(rid, text, fallback, msg):
	answers[rid] = ["line", {"text": text, "fallback": fallback, "tokens": msg["tokens"]}]


func _on_ok(rid):
	answers[rid] = ["ok", null]


func _on_busy(rid, retry_after_ms):
	answers[rid] = ["busy", retry_after_ms]


func _on_request_error(rid, code, reason):
	answers[rid] = ["error", code]


func _welcomed():
	return welcomed


func _answered():
	return answers.has(_want)


func _until(condition, timeout_s, what):
	yield(self, "idle_frame")
	var deadline = OS.get_ticks_msec() + int(timeout_s * 1000)
	while not call(condition):
		if OS.get_ticks_msec() > deadline:
			_check("waited for " + what, false)
			return false
		d.poll()
		yield(self, "idle_frame")
	return true


func _answer(rid, timeout_s = 30):
	_want = rid
	var ok = yield(_until("_answered", timeout_s, "the answer to request %d" % rid), "completed")
	return answers[rid] if ok else [null, null]


func _run():
	d = Dialogue.new()
	for s in ["welcome", "session", "piece", "line", "ok", "busy", "request_error"]:
		d.connect(s, self, "_on_" + s)
	d.start(args["url"], args["token"])
	if not (yield(_until("_welcomed", 20, "welcome"), "completed")):
		return _finish()
	var a = yield(_answer(d.open_session(args["archetype"], args["state"])), "completed")
	_check("session opened", a[0] == "session", a)
	if a[0] != "session":
		return _finish()
	var sid = a[1]

	var rid = d.request_line(sid, args["intent"], true, 16, 3)
	a = yield(_answer(rid), "completed")
	_check("a line", a[0] == "line" and a[1]["text"].length() > 0, a)
	if a[0] == "line":
		var streamed = PoolStringArray(pieces.get(rid, [])).join("")
		_check("the pieces add up to the line", a[1]["fallback"] or streamed == a[1]["text"],
				[streamed, a[1]["text"]])
		result["line"] = a[1]

	rid = d.request_line(sid, args["intent"], true, 256, 4)
	d.cancel(rid)
	a = yield(_answer(rid), "completed")
	_check("cancelled", a[0] == "error" and a[1] == "cancelled", a)

	a = yield(_answer(d.close_session(sid)), "completed")
	_check("session closed", a[0] == "ok", a)
	_passed()
	_finish()


func _finish():
	if d.is_open:
		d.bye()
		for i in range(10):
			d.poll()
	_report()
