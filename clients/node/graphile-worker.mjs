// ESM entry point of listenhub/graphile-worker.
import graphile from './lib/graphile.js'; // not ./graphile-worker.js: see lib/api.js

export const { hubPool } = graphile;
export default { hubPool };
