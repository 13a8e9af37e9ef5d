// The JS SDK's decoupled handler (`streaming`), under node with fake senders: streams take
// turns in `resume`, each stream's responses stay in order, and every way a stream ends
// disposes its sender. tests/python/test_js_models.py serves a streaming handler for real.
import assert from "node:assert/strict";
import { test } from "node:test";

import { fromStrings, invalidInput, streaming } from "../../guest-sdk-js/src/index.js";

// A response of one BYTES output holding `text`, and back.
const says = (text) => ({ outputs: [fromStrings("OUT", [1], [text])] });
const said = (tensor) => new TextDecoder().decode(tensor.data.val[0]);

function fakeSender(name, log, { goneAfter = Infinity } = {}) {
  let sent = 0;
  return {
    send(response, final) {
      if (sent++ >= goneAfter) throw new Error("cancelled");
      log.push([name, said(response.outputs[0]), final]);
    },
    finish() {
      log.push([name, "finish"]);
    },
    sendError(error) {
      log.push([name, `${error.kind}: ${error.message}`]);
    },
    [Symbol.dispose]() {
      log.push([name, "disposed"]);
    },
  };
}

const words = streaming({
  *executeRequest(request) {
    if (request.words.length === 0) throw invalidInput("no words");
    try {
      for (const w of request.words) yield says(w);
    } finally {
      request.closed = true;
    }
  },
});

function drive(handler) {
  for (let i = 0; i < 1000; i++) {
    if (handler.resume() === null) return;
  }
  assert.fail("the streams did not end");
}

test("streams take turns, each in order", () => {
  const log = [];
  words.execute([
    [{ words: ["a1", "a2", "a3"] }, fakeSender("a", log)],
    [{ words: ["b1", "b2"] }, fakeSender("b", log)],
  ]);
  assert.deepEqual(log, []); // execute only starts them
  drive(words);
  assert.deepEqual(log.map(([n, v]) => `${n}:${v}`), [
    "a:a1", "b:b1", "a:a2", "b:b2", "a:a3", "b:finish", "b:disposed", "a:finish", "a:disposed",
  ]);
});

test("a request that joins later streams beside the running ones", () => {
  const log = [];
  const many = Array.from({ length: 200_000 }, (_, i) => `w${i}`);
  words.execute([[{ words: many }, fakeSender("long", log)]]);
  assert.equal(words.resume(), 0); // a turn ends after its time slice: call again at once
  words.execute([[{ words: ["x"] }, fakeSender("late", log)]]);
  words.resume();
  const late = log.findIndex(([n]) => n === "late");
  const longDone = log.findIndex(([n, v]) => n === "long" && v === "finish");
  assert.ok(late >= 0 && (longDone === -1 || late < longDone), "the late stream waited");
  drive(words);
  assert.equal(log.filter(([n, v]) => n === "long" && v.startsWith?.("w")).length, many.length);
});

test("a thrown error ends only its stream, and a gone caller stops the generator", () => {
  const log = [];
  const gone = { words: ["g1", "g2", "g3"] };
  words.execute([
    [{ words: [] }, fakeSender("bad", log)],
    [gone, fakeSender("gone", log, { goneAfter: 1 })],
    [{ words: ["ok"] }, fakeSender("ok", log)],
  ]);
  drive(words);
  assert.deepEqual(log.filter(([n]) => n === "bad").map(([, v]) => v),
    ["invalid-input: no words", "disposed"]);
  assert.deepEqual(log.filter(([n]) => n === "gone").map(([, v]) => v), ["g1", "disposed"]);
  assert.equal(gone.closed, true); // its `finally` ran
  assert.deepEqual(log.filter(([n]) => n === "ok").map(([, v]) => v), ["ok", "finish", "disposed"]);
});

test("a plain function answers with one final response", () => {
  const log = [];
  const once = streaming({ executeRequest: () => says("only") });
  once.execute([[{}, fakeSender("one", log)]]);
  assert.equal(once.resume(), null);
  assert.deepEqual(log, [["one", "only", true], ["one", "disposed"]]);
});

test("a unary handler that answers with nothing or a Promise fails the request", async () => {
  const { model } = await import("../../guest-sdk-js/src/index.js");
  for (const [value, says] of [[null, "returned null"], [undefined, "returned undefined"],
    [new Promise(() => {}), "returned a Promise"]]) {
    const handler = model({ executeRequest: () => value });
    const [result] = handler.execute([{}]);
    assert.equal(result.tag, "err");
    assert.match(result.val.message, new RegExp(says));
  }
  const { fromStrings } = await import("../../guest-sdk-js/src/index.js");
  const x = fromStrings("OUT", [1], ["x"]);
  const ok = model({ executeRequest: () => ({ outputs: [x] }) });
  assert.deepEqual(ok.execute([{}]), [{ tag: "ok", val: { outputs: [x], parameters: [] } }]);
});

test("a malformed answer fails its request, saying what is wrong, instead of trapping", async () => {
  const { model } = await import("../../guest-sdk-js/src/index.js");
  for (const [value, says] of [
    [{ outputs: "nope" }, "outputs is an array of tensors"],
    [{ outputs: ["x"] }, "output 0 is string, not a tensor"],
    [{ outputs: [{ name: "OUT" }] }, "has datatype undefined"],
    [{ outputs: [], parameters: { a: 1 } }, "parameters is an array"],
    [{ outputs: [], parameters: [{ key: "a", value: 5 }] }, "a parameter that is not"],
    [{ outputs: [], parameters: [{ key: 1, value: { tag: "int", val: 5n } }] }, "5n"],
  ]) {
    const [result] = model({ executeRequest: () => value }).execute([{}]);
    assert.equal(result.tag, "err");
    assert.match(result.val.message, new RegExp(says));
  }
});

test("a malformed streamed response ends its stream with the reason, not a trap", () => {
  const log = [];
  const bad = streaming({
    *executeRequest() {
      yield says("fine");
      yield { outputs: "nope" };
    },
  });
  bad.execute([[{}, fakeSender("bad", log)]]);
  while (bad.resume() !== null);
  assert.deepEqual(log[0], ["bad", "fine", false]);
  assert.match(log[1][1], /outputs is an array of tensors/);
});
