// Validates rendered Kubernetes manifests offline against the API schemas that the npm packages
// kubernetes-models and @kubernetes-models/prometheus-operator ship (types, required fields,
// formats). Usage: node validate-manifests.mjs <tools-node-dir> <file.yaml>...
// Exit 0: every object valid; 1: some object invalid (each printed); 2: usage/setup error.
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [toolsDir, ...files] = process.argv.slice(2);
if (!toolsDir || files.length === 0) {
  console.error("usage: validate-manifests.mjs <tools-node-dir> <file.yaml>...");
  process.exit(2);
}
const modules = path.join(toolsDir, "node_modules");
const yaml = createRequire(path.join(toolsDir, "package.json"))("js-yaml");

// apiVersion + kind -> the model module's file.
function modelFile(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return path.join(modules, "@kubernetes-models/prometheus-operator", apiVersion, `${kind}.js`);
  }
  return path.join(modules, "kubernetes-models", apiVersion, `${kind}.js`);
}

// CRDs whose schemas no npm package here ships: reported, not validated (helm-test.sh asserts
// their fields).
const unvalidated = ["cert-manager.io/"];

let objects = 0;
let failures = 0;
let skipped = 0;
for (const file of files) {
  const docs = yaml.loadAll(readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    const what = `${file}: ${doc.kind}/${doc.metadata?.name}`;
    if (unvalidated.some((p) => (doc.apiVersion ?? "").startsWith(p))) {
      console.log(`skip ${what}: no offline schema for ${doc.apiVersion}`);
      skipped++;
      continue;
    }
    const mod = modelFile(doc.apiVersion ?? "", doc.kind ?? "");
    if (!existsSync(mod)) {
      console.error(`FAIL ${what}: no schema for ${doc.apiVersion} ${doc.kind}`);
      failures++;
      continue;
    }
    const Model = (await import(pathToFileURL(mod).href))[doc.kind];
    try {
      new Model(doc).validate();
      objects++;
      console.log(`ok   ${what}`);
    } catch (e) {
      console.error(`FAIL ${what}: ${e.message}`);
      failures++;
    }
  }
}
console.log(`validate-manifests: ${objects} valid, ${failures} invalid, ${skipped} not validated`);
process.exit(failures === 0 ? 0 : 1);
