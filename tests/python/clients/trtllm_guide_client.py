"""The gRPC client of the TensorRT-LLM serving guide (ChatGLM2-6B on Triton, section 4: "GRPC-Client
调用脚本"), reproduced call for call: a transformers tokenizer, `input_ids` and
`request_output_len` only, `async_infer` with a callback and `parameters={'Streaming': False}`,
`output_ids[0]` read per beam with the prompt sliced off. With `--streaming` it streams instead,
as TensorRT-LLM's own inflight_batcher_llm client does (`start_stream`, `async_stream_infer`,
the `streaming` input).

What changed for Tessera is only what the guide hard-codes for its machine — the tokenizer
folder, the server address, the model name and the prompt — taken here from the command line:

    trtllm_guide_client.py TOKENIZER_DIR URL MODEL TEXT [--streaming] [--output-len N]

It prints the output text as JSON on the last line.
"""
import argparse
import json
import queue
import sys
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def prepare_tensor(name, input):
    t = grpcclient.InferInput(name, input.shape, np_to_triton_dtype(input.dtype))
    t.set_data_from_numpy(input)
    return t


class UserData:
    def __init__(self):
        self._completed_requests = queue.Queue()


def callback(user_data, result, error):
    if error:
        user_data._completed_requests.put(error)
    else:
        user_data._completed_requests.put(result)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tokenizer_dir")
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("text")
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--output-len", type=int, default=100)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir, legacy=False, padding_side="left",
                                              truncation_side="left", trust_remote_code=True,
                                              use_fast=True)
    input_ids = [tokenizer.encode(args.text)]
    input_ids_data = np.array(input_ids, dtype=np.int32)
    request_output_len_data = np.array([[args.output_len]], dtype=np.int32)
    inputs = [
        prepare_tensor("input_ids", input_ids_data),
        prepare_tensor("request_output_len", request_output_len_data),
    ]
    user_data = UserData()
    actual_output_ids = []
    with grpcclient.InferenceServerClient(url=args.url, verbose=False, ssl=False) as triton_client:
        if not args.streaming:
            triton_client.async_infer(args.model, inputs, outputs=None, request_id="",
                                      callback=partial(callback, user_data),
                                      parameters={"Streaming": False})
            result = user_data._completed_requests.get()
            if isinstance(result, InferenceServerException):
                sys.exit(f"Received an error from server: {result}")
            output_ids = result.as_numpy("output_ids")
            for beam_output_ids in output_ids[0]:
                actual_output_ids.append(list(beam_output_ids))
            output_ids_wo_prompt = actual_output_ids[0][input_ids_data.shape[1]:]
        else:
            inputs.append(prepare_tensor("streaming", np.array([[True]], dtype=bool)))
            triton_client.start_stream(callback=partial(callback, user_data))
            triton_client.async_stream_infer(args.model, inputs, request_id="1")
            output_ids_wo_prompt = []
            while True:
                result = user_data._completed_requests.get()
                if isinstance(result, InferenceServerException):
                    sys.exit(f"Received an error from server: {result}")
                output_ids_wo_prompt.extend(result.as_numpy("output_ids")[0][0].tolist())
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            triton_client.stop_stream()
    output_text = tokenizer.decode(output_ids_wo_prompt)
    print(f"Input: {args.text}")
    print(json.dumps({"output_ids": [int(t) for t in output_ids_wo_prompt], "text": output_text}))


if __name__ == "__main__":
    main()
