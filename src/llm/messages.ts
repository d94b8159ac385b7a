/**
 * The wire types of a conversation with a model, as the model client and the actors see them. They
 * are defined in the pure core (`schemas/messages.ts`) because the journal and the history store
 * them, and those sit below the model client.
 */
export * from '../schemas/messages.js';
