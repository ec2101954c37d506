// Runs the compiled kernels on float32 inputs from files and writes the results back, for
// tests/test_wasm_kernels.py. Usage: node wasm_kernels_harness.mjs <kernels.wasm> <dir>
// <dir>/job.json names the calls; every array lives in one shared WebAssembly.Memory, as it does on
// Pyodide's heap.
import fs from 'node:fs';
import path from 'node:path';

const [wasmPath, dir] = process.argv.slice(2);
const job = JSON.parse(fs.readFileSync(path.join(dir, 'job.json'), 'utf8'));
const memory = new WebAssembly.Memory({ initial: 64 });
const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), { env: { memory } });
const addresses = {};
let next = 1024;
for (const [name, size] of Object.entries(job.arrays)) {
  addresses[name] = next;
  const data = fs.readFileSync(path.join(dir, `${name}.f32`));
  new Uint8Array(memory.buffer, next, data.length).set(data);
  next += Math.ceil(size * 4 / 16) * 16;
}
for (const [kernel, args] of job.calls) {
  instance.exports[kernel](...args.map((a) => (typeof a === 'string' ? addresses[a] : a)));
}
for (const [name, size] of Object.entries(job.arrays)) {
  fs.writeFileSync(path.join(dir, `${name}.out.f32`), new Uint8Array(memory.buffer, addresses[name], size * 4));
}
