# JSON messages over a WebSocket text connection: what flashnpc_sync.gd and
# flashnpc_dialogue.gd share (copy it with them). Call poll() every frame.
extends Reference

signal opened()
signal message(msg)        # a Dictionary (frames that are not a JSON object are skipped)
signal closed()            # the connection closed or could not be opened

var is_open = false
var _ws = null


func open(url):
	_ws = WebSocketClient.new()
	_ws.connect("connection_established", self, "_on_open")
	_ws.connect("data_received", self, "_on_data")
	_ws.connect("connection_closed", self, "_on_closed")
	_ws.connect("connection_error", self, "_on_closed")
	var err = _ws.connect_to_url(url)
	if err != OK:
		_on_closed()
	return err


func poll():
	if _ws != null:
		_ws.poll()


func send(msg):
	_ws.get_peer(1).put_packet(JSON.print(msg).to_utf8())


func close(code = 1000, reason = ""):
	if _ws != null:
		_ws.disconnect_from_host(code, reason)


func _on_open(_protocol):
	_ws.get_peer(1).set_write_mode(WebSocketPeer.WRITE_MODE_TEXT)
	is_open = true
	emit_signal("opened")


func _on_data():
	var peer = _ws.get_peer(1)
	while peer.get_available_packet_count() > 0:
		var parsed = JSON.parse(peer.get_packet().get_string_from_utf8())
		if parsed.error == OK and typeof(parsed.result) == TYPE_DICTIONARY:
			emit_signal("message", parsed.result)


func _on_closed(_was_clean = false):
	is_open = false
	emit_signal("closed")
