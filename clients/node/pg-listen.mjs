// ESM entry point of listenhub/pg-listen (the CommonJS module is the one
// implementation).
import createPostgresSubscriber from './pg-listen.js';

export { createPostgresSubscriber };
export default createPostgresSubscriber;
