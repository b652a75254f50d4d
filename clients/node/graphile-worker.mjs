// ESM entry point of listenhub/graphile-worker.
import cjs from './graphile-worker.js';

export const { hubPool } = cjs;
export default cjs;
