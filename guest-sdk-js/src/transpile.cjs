// `tessera build`'s TypeScript step: every .ts file of a folder becomes an ES module .js beside
// it (types stripped, no type check: run `tsc --noEmit` for that). Run as
//   node transpile.cjs <typescript package folder> <folder>
// CommonJS, so that the typescript package is loaded from the path given, not resolved.
"use strict";
const fs = require("fs");
const path = require("path");

const [typescriptDir, folder] = process.argv.slice(2);
const ts = require(typescriptDir);
let failed = false;
for (const name of fs.readdirSync(folder)) {
  if (!name.endsWith(".ts") || name.endsWith(".d.ts")) continue;
  const file = path.join(folder, name);
  const out = ts.transpileModule(fs.readFileSync(file, "utf8"), {
    fileName: file,
    reportDiagnostics: true,
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022 },
  });
  for (const d of out.diagnostics ?? []) {
    const where = d.file && d.start !== undefined
      ? `${name}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}: ` : `${name}: `;
    console.error(where + ts.flattenDiagnosticMessageText(d.messageText, "\n"));
    failed = true;
  }
  fs.writeFileSync(file.replace(/\.ts$/, ".js"), out.outputText);
}
process.exit(failed ? 1 : 0);
