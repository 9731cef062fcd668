# Headless check of flashnpc_sync.gd against a running `flashnpc serve` (sim world):
#
#   godot3-server --no-window --path examples/godot -s check_sync.gd \
#       --url=ws://127.0.0.1:8765 --http=127.0.0.1:8766 --admin=ADMIN_TOKEN \
#       --token=JWT --player=alice
#
# Joins, follows deltas, sends moves and a talk, drops its connection and resumes (with
# intents sent while away), then freezes the world over the admin API and compares its
# replica and position with the server's /admin/areas. Prints one line `RESULT {json}` and
# exits 0 when every check passed, 1 otherwise.
extends "res://check_base.gd"

const Sync = preload("res://flashnpc_sync.gd")

var sync = null
var _last_ms = 0


func _tick():
	var now = OS.get_ticks_msec()
	if sync != null:
		sync.poll((now - _last_ms) / 1000.0)
	_last_ms = now
	yield(self, "idle_frame")


func _until(condition, timeout_s, what):
	yield(_tick(), "completed")
	var deadline = OS.get_ticks_msec() + int(timeout_s * 1000)
	while not call(condition):
		if OS.get_ticks_msec() > deadline:
			_check("waited for " + what, false)
			return false
		yield(_tick(), "completed")
	return true


func _synced():
	return sync.is_synced


func _settled():
	return sync.is_synced and sync.unacked.size() == 0


func _dropped():
	return not sync.is_connected_now()


func _three_deltas():
	return sync.deltas >= 3


func _nearest_npc():
	var best = null
	var best_d = 1e30
	for id in sync.npcs:
		var p = sync.npcs[id]["pos"]
		var d = Vector2(p[0], p[1]).distance_to(sync.position)
		if d < best_d:
			best_d = d
			best = id
	return best


func _http(method, path):
	# [status, parsed JSON body] of an admin request (bearer token), polling the sync client
	yield(_tick(), "completed")
	var hp = args["http"].split(":")
	var h = HTTPClient.new()
	h.connect_to_host(hp[0], int(hp[1]))
	while h.get_status() in [HTTPClient.STATUS_CONNECTING, HTTPClient.STATUS_RESOLVING]:
		h.poll()
		yield(_tick(), "completed")
	h.request(method, path, ["Authorization: Bearer " + args["admin"]], "")
	while h.get_status() == HTTPClient.STATUS_REQUESTING:
		h.poll()
		yield(_tick(), "completed")
	var body = PoolByteArray()
	while h.get_status() == HTTPClient.STATUS_BODY:
		h.poll()
		var chunk = h.read_response_body_chunk()
		if chunk.size() == 0:
			yield(_tick(), "completed")
		else:
			body.append_array(chunk)
	var code = h.get_response_code()
	h.close()
	return [code, JSON.parse(body.get_string_from_utf8()).result]


func _run():
	var player = args["player"]
	sync = Sync.new()
	sync.start(args["url"], args["token"], Vector2(100, 100))
	if not (yield(_until("_synced", 20, "the first snapshot"), "completed")):
		return _finish()
	_check("snapshot", sync.snapshots == 1 and sync.epoch != null)

	# moves at walking pace, and a talk to the nearest NPC
	var target = _nearest_npc()
	_check("an NPC in the area", target != null)
	for k in range(5):
		sync.send_intent(Vector2(100 + 2 * (k + 1), 100))
	sync.send_intent(null, [target, "greet"])
	if not (yield(_until("_settled", 20, "acks of the intents"), "completed")):
		return _finish()
	_check("intents acknowledged", sync.acked == 6)

	# NPC state changes arrive as deltas
	if not (yield(_until("_three_deltas", 30, "deltas"), "completed")):
		return _finish()

	# a dropped connection, intents while away, a resume
	var connects = sync.connects
	sync.drop_connection()
	yield(_until("_dropped", 10, "the drop"), "completed")
	sync.send_intent(Vector2(112, 100))
	sync.send_intent(Vector2(114, 100))
	if not (yield(_until("_settled", 30, "the resume"), "completed")):
		return _finish()
	_check("reconnected", sync.connects == connects + 1)
	_check("resumed without a snapshot", sync.resumes == 1 and sync.snapshots == 1,
			{"resumes": sync.resumes, "snapshots": sync.snapshots})
	_check("intents sent while away acknowledged", sync.acked == 8)

	# the replica against the server's view, on a frozen world
	var r = yield(_http(HTTPClient.METHOD_POST, "/admin/freeze"), "completed")
	_check("freeze", r[0] == 200 and r[1]["frozen"] == true, r)
	var area = null
	var deadline = OS.get_ticks_msec() + 10000
	while OS.get_ticks_msec() < deadline:
		r = yield(_http(HTTPClient.METHOD_GET, "/admin/areas?player=" + player), "completed")
		area = r[1][player]
		if int(area["seq"]) == sync.seq:
			break
		yield(_tick(), "completed")
	_check("replica seq", int(area["seq"]) == sync.seq, [area["seq"], sync.seq])
	_check("replica npcs", JSON.print(area["npcs"], "", true) == JSON.print(sync.npcs, "", true))
	var pos = Vector2(area["player_pos"][0], area["player_pos"][1])
	_check("player position", pos.distance_to(sync.position) < 1e-6, [pos, sync.position])
	_check("the talk reached the NPC", sync.npcs[target]["state"]["talking_to"] == player)
	r = yield(_http(HTTPClient.METHOD_POST, "/admin/freeze?on=0"), "completed")
	_check("unfreeze", r[0] == 200 and r[1]["frozen"] == false)
	_passed()
	_finish()


func _finish():
	result["figures"] = {"connects": sync.connects, "snapshots": sync.snapshots,
			"deltas": sync.deltas, "resumes": sync.resumes, "gaps": sync.gaps,
			"acked": sync.acked, "npcs": sync.npcs.size()}
	sync.close()
	for i in range(10):
		sync.poll(0.01)
	_report()
