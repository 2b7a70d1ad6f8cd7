# Thin aliases for ./run, which the README and .ci/run call.
.PHONY: demo test
demo:
	./run demo
test:
	./run test
