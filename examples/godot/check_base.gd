# What the headless checks share: `--key=value` arguments, named checks, the RESULT line.
extends SceneTree

var args = {}
var result = {"ok": false, "checks": {}}


func _init():
	Engine.target_fps = 100
	for a in OS.get_cmdline_args():
		if a.begins_with("--") and a.find("=") > 0:
			var kv = a.substr(2, a.length()).split("=", true, 1)
			args[kv[0]] = kv[1]
	call_deferred("_run")


func _run():
	pass


func _check(name, passed, detail = null):
	result["checks"][name] = passed if detail == null else [passed, detail]
	if not passed:
		print("CHECK FAILED: ", name, " ", detail)


func _passed():
	# every check ran passed: the result is ok
	result["ok"] = true
	for name in result["checks"]:
		var v = result["checks"][name]
		if typeof(v) == TYPE_ARRAY:
			v = v[0]
		result["ok"] = result["ok"] and v


func _report():
	print("RESULT " + JSON.print(result))
	OS.exit_code = 0 if result["ok"] else 1
	quit()
