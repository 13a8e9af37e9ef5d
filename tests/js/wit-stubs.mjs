// Runs the JS SDK (guest-sdk-js/src/index.js) under node, without a component: the WIT imports
// it names (`tessera:inference/...`) resolve to empty modules. Used by `node --import`.
import { register } from "node:module";

register("data:text/javascript," + encodeURIComponent(`
  export async function resolve(specifier, context, next) {
    if (specifier.startsWith("tessera:")) {
      return { url: "data:text/javascript,export default {}", shortCircuit: true };
    }
    return next(specifier, context);
  }
`));
