// Links the kernels into a Pyodide runtime (Node) as static/worker.js does and runs a Python file
// with them as `kernels` (the exports), on NumPy arrays in Pyodide's heap; prints the file's last
// expression (JSON). With a peer bundle (server/peer_runtime.py), its code is importable first, as in
// the page's worker. Usage:
// node wasm_kernels_pyodide.mjs <pyodide.mjs> <runtime dir/> <kernels.wasm> <python file> [<bundle.zip>]
import fs from 'node:fs';

const [pyodideModule, indexURL, wasmPath, script, bundle] = process.argv.slice(2);
const { loadPyodide } = await import(pyodideModule);
const pyodide = await loadPyodide({ indexURL });
await pyodide.loadPackage('numpy', { messageCallback: () => {} });
if (bundle) {
  pyodide.unpackArchive(new Uint8Array(fs.readFileSync(bundle)), 'zip', { extractDir: '/home/pyodide/peer' });
  pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/peer')");
}
const kernels = pyodide._module.loadWebAssemblyModule(
  new Uint8Array(fs.readFileSync(wasmPath)), { loadAsync: false, global: false, nodelete: true }, 'dtn_kernels', {}, 0);
pyodide.globals.set('kernels', kernels);
console.log(pyodide.runPython(fs.readFileSync(script, 'utf8')));
