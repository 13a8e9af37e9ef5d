// Streams TEXT back one word at a time, each with its index: a decoupled model whose
// executeRequest is a generator. Build: `tessera build examples/js/count_ts`.
import { asStrings, fromI32, fromStrings, input, invalidInput, streaming, type Request,
  type Response } from "@tessera/guest";

export const decoupledHandler = streaming({
  *executeRequest(request: Request): Generator<Response> {
    const [text]: string[] = asStrings(input(request, "TEXT"));
    const words = text.split(/\s+/).filter((w) => w.length > 0);
    if (words.length === 0) {
      throw invalidInput("TEXT has no words");
    }
    for (let i = 0; i < words.length; i++) {
      yield { outputs: [fromStrings("WORD", [1], [words[i]]), fromI32("INDEX", [1], [i])] };
    }
  },
});
