// Compiles the browser trainer's WebAssembly text kernels (SIMD128) to a binary with wabt, with a
// leading `dylink.0` section (no data, no table) so that Pyodide's `loadWebAssemblyModule` links it
// against Pyodide's own memory: the kernels then read NumPy arrays by address, without copies.
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
const wasm = Buffer.from(module.toBinary({}).buffer);
// dylink.0 = subsection WASM_DYLINK_MEM_INFO (1), 4 bytes: memory size, alignment, table size, alignment.
// It must be the first section (wabt's placement annotations do not reach the binary), after the header.
const name = Buffer.from('dylink.0');
const body = Buffer.concat([Buffer.from([name.length]), name, Buffer.from([1, 4, 0, 0, 0, 0])]);
const header = wasm.subarray(0, 8);
fs.writeFileSync(target, Buffer.concat([header, Buffer.from([0, body.length]), body, wasm.subarray(8)]));
