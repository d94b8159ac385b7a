/** Model names as routers and gateways spell them. */

/** The model name without a provider prefix: `openai/gpt-4o` → `gpt-4o` (everything after the last `/`). */
export function stripProviderPrefix(model: string): string {
  const slash = model.lastIndexOf('/');
  return slash === -1 ? model : model.slice(slash + 1);
}
