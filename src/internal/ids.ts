/**
 * What ids look like where they become parts of Redis keys and BullMQ job ids. Kept below both the
 * plan schema (which validates plans) and the key builder (which validates keys) so they agree.
 */

/** Step ids go into Redis keys and BullMQ job ids: no ':', '{', '}' or spaces. */
export const STEP_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
