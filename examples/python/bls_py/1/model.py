"""Business logic with Tessera's Python API: calls the model named by MODEL_NAME on INPUT0 and
INPUT1 through the server's queue and answers with its outputs. An unknown model raises
tessera.ModelNotFound, which answers this request 404 unless caught."""

import tessera


class Bls(tessera.Handler):
    def execute(self, request: tessera.Request) -> tessera.Response:
        [callee] = request.strings("MODEL_NAME")
        answer = tessera.infer(callee, {"INPUT0": request.input("INPUT0"),
                                        "INPUT1": request.input("INPUT1")},
                               outputs=["OUTPUT0", "OUTPUT1"])
        return tessera.Response(answer.outputs)
