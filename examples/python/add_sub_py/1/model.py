"""add_sub with Tessera's Python API: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

import tessera


class AddSub(tessera.Handler):
    def initialize(self, config: dict) -> None:
        self.outputs = [o["name"] for o in config["output"]]
        # On the server's /metrics as add_sub_py_elements_total{model="add_sub_py"}.
        self.elements = tessera.counter("add_sub_py_elements_total", "Elements added",
                                        {"model": config["name"]})
        tessera.log.info(f"{config['name']} serves {', '.join(self.outputs)}")

    def execute(self, request: tessera.Request) -> tessera.Response:
        a = request.numpy("INPUT0")
        b = request.numpy("INPUT1")
        if a.shape != b.shape:
            raise tessera.InvalidInput(f"INPUT0 {list(a.shape)} and INPUT1 {list(b.shape)} "
                                       "differ in shape")
        self.elements.increment(a.size)
        return tessera.Response({"OUTPUT0": a + b, "OUTPUT1": a - b})
