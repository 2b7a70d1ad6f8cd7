# Thin aliases for ./run, which the README and .ci/run call.
.PHONY: demo test fast
demo:
	./run demo
test:
	./run test
fast:
	./run fast
