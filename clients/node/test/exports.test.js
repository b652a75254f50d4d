'use strict';

// The three faces of the package name the same things: the CommonJS
// exports (index.js), the ESM named exports (index.mjs) and the TypeScript
// declarations (index.d.ts). A name added to one and not the others fails
// here, so `import { X } from 'listenhub'` never breaks for a new X.

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');

test('ESM named exports are the CommonJS exports, as the same objects', async () => {
  const cjs = require(root);
  const esm = await import(path.join(root, 'index.mjs'));
  const named = Object.keys(esm).filter((k) => k !== 'default').sort();
  assert.deepStrictEqual(named, Object.keys(cjs).sort());
  for (const k of named) assert.strictEqual(esm[k], cjs[k], k);
  assert.strictEqual(esm.default, cjs);
});

test('index.d.ts declares every export and nothing else', () => {
  const cjs = require(root);
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const declared = [...dts.matchAll(/^export (?:declare )?(?:class|function|const) (\w+)/gm)].map((m) => m[1]);
  assert.deepStrictEqual([...new Set(declared)].sort(), Object.keys(cjs).sort());
});

test('package.json exports point at files the package ships', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  const entry = pkg.exports['.'];
  for (const k of ['types', 'import', 'require']) {
    const f = entry[k].replace(/^\.\//, '');
    assert.ok(fs.existsSync(path.join(root, f)), `${k}: ${f} is missing`);
    assert.ok(pkg.files.includes(f), `${k}: ${f} is not in "files"`);
  }
});

test('no ESM entry can resolve to itself, whatever the resolver prefers', () => {
  // A common jest set-up for ESM maps './x.js' to './x' and tries .mjs
  // before .js: an entry that imported './index.js' then imported itself.
  // Each entry's relative imports, resolved that way, must name another
  // file.
  const resolve = (from, spec) => {
    const base = path.resolve(path.dirname(from), spec.replace(/\.js$/, ''));
    for (const ext of ['.mjs', '.js', '.cjs', '']) {
      if (fs.existsSync(base + ext) && fs.statSync(base + ext).isFile()) return base + ext;
    }
    return null;
  };
  for (const entry of ['index.mjs', 'pg-listen.mjs', 'graphile-worker.mjs']) {
    const file = path.join(root, entry);
    const specs = [...fs.readFileSync(file, 'utf8').matchAll(/from\s+'(\.[^']+)'/g)].map((m) => m[1]);
    assert.ok(specs.length > 0, `${entry} imports nothing`);
    for (const spec of specs) {
      const got = resolve(file, spec);
      assert.ok(got, `${entry}: ${spec} resolves to nothing`);
      assert.notStrictEqual(got, file, `${entry}: ${spec} resolves to the entry itself`);
    }
  }
});
