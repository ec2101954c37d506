// Compiles the browser trainer's WebAssembly text kernels (SIMD128) to a binary with wabt, with a
// leading `dylink.0` section (no data, no table) so that Pyodide's `loadWebAssemblyModule` links it
// against Pyodide's own memory: the kernels then read NumPy arrays by address, without copies.
// With --fma, each multiply-add of a vector accumulator in the text, written
// (f32x4.add (local.get $acc) (f32x4.mul (local.get $x) (local.get $y))), is compiled as relaxed SIMD's
// (f32x4.relaxed_madd (local.get $x) (local.get $y) (local.get $acc)): one fused multiply-add where the
// CPU has one (decision 0052). The build fails when the text has no such multiply-add to rewrite.
// Usage: node tools/build_kernels.mjs [--fma] <in.wat> <out.wasm>
import fs from 'node:fs';
import path from 'node:path';
import wabtFactory from 'wabt';

const args = process.argv.slice(2);
const fma = args[0] === '--fma';
const [source, target] = fma ? args.slice(1) : args;
if (!source || !target) {
  console.error('usage: node tools/build_kernels.mjs [--fma] <in.wat> <out.wasm>');
  process.exit(2);
}
const MULTIPLY_ADD =
  /\(f32x4\.add \(local\.get (\$\w+)\) \(f32x4\.mul (\(local\.get \$\w+\)) (\(local\.get \$\w+\))\)\)/g;
let text = fs.readFileSync(source, 'utf8');
if (fma) {
  const sites = text.match(MULTIPLY_ADD)?.length ?? 0;
  if (sites === 0) {
    console.error(`${source}: no (f32x4.add (local.get $acc) (f32x4.mul ...)) to fuse`);
    process.exit(1);
  }
  text = text.replace(MULTIPLY_ADD, '(f32x4.relaxed_madd $2 $3 (local.get $1))');
  console.log(`${target}: ${sites} multiply-adds fused`);
}
const wabt = await wabtFactory();
const module = wabt.parseWat(path.basename(source), text, { simd: true, relaxed_simd: fma });
module.validate();
fs.mkdirSync(path.dirname(target), { recursive: true });
const wasm = Buffer.from(module.toBinary({}).buffer);
// dylink.0 = subsection WASM_DYLINK_MEM_INFO (1), 4 bytes: memory size, alignment, table size, alignment.
// It must be the first section (wabt's placement annotations do not reach the binary), after the header.
const name = Buffer.from('dylink.0');
const body = Buffer.concat([Buffer.from([name.length]), name, Buffer.from([1, 4, 0, 0, 0, 0])]);
const header = wasm.subarray(0, 8);
fs.writeFileSync(target, Buffer.concat([header, Buffer.from([0, body.length]), body, wasm.subarray(8)]));
