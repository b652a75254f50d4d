// ESM entry point of listenhub/pg-listen (the CommonJS module is the one
// implementation).
import pglisten from './lib/pglisten.js'; // not ./pg-listen.js: see lib/api.js

const { createPostgresSubscriber } = pglisten;

export { createPostgresSubscriber };
export default createPostgresSubscriber;
