// Compiles the browser trainer's WebAssembly text kernels (SIMD128) to a binary with wabt.
// Usage: node tools/build_kernels.mjs <in.wat> <out.wasm>
import fs from 'node:fs';
import path from 'node:path';
import wabtFactory from 'wabt';

const [source, target] = process.argv.slice(2);
if (!source || !target) {
  console.error('usage: node tools/build_kernels.mjs <in.wat> <out.wasm>');
  process.exit(2);
}
const wabt = await wabtFactory();
const module = wabt.parseWat(path.basename(source), fs.readFileSync(source, 'utf8'), { simd: true });
module.validate();
fs.mkdirSync(path.dirname(target), { recursive: true });
fs.writeFileSync(target, Buffer.from(module.toBinary({}).buffer));
