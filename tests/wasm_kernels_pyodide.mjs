// Links the kernels into a Pyodide runtime (Node) and runs them on NumPy arrays in Pyodide's heap,
// passed by address; prints the Python result (JSON). Usage:
// node wasm_kernels_pyodide.mjs <pyodide.mjs> <runtime dir/> <kernels.wasm> <python file>
import fs from 'node:fs';

const [pyodideModule, indexURL, wasmPath, script] = process.argv.slice(2);
const { loadPyodide } = await import(pyodideModule);
const pyodide = await loadPyodide({ indexURL });
await pyodide.loadPackage('numpy', { messageCallback: () => {} });
const kernels = pyodide._module.loadWebAssemblyModule(
  new Uint8Array(fs.readFileSync(wasmPath)), { loadAsync: false, global: false, nodelete: true }, 'dtn_kernels', {}, 0);
pyodide.globals.set('kernels', kernels);
console.log(pyodide.runPython(fs.readFileSync(script, 'utf8')));
