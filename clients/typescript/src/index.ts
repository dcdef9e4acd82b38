export { Rest, type RestOptions, type Schemas, type TokenProvider } from './rest.js';
export { ProblemError, type Problem } from './problem.js';
export { Gateway, CloseCode, SUBPROTOCOL, type ConnectionState, type GatewayOptions } from './gateway.js';
export type * from './frames.js';
export type { paths, components } from './openapi.js';
