/** What a promise rejected with, or undefined when it resolved: for asserting on errors' fields. */
export async function caught(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => undefined,
    (e: unknown) => e,
  );
}
