import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigurationError, InputValidationError } from '../../src/errors.js';
import { defineAgent } from '../../src/agents/define-agent.js';
import {
  checkVersion,
  registerAgent,
  registerAll,
  registerOperator,
  registerPolicy,
} from '../../src/operations/registration.js';
import { createToolRegistry } from '../../src/tools/registry.js';
import { defineTool } from '../../src/tools/define-tool.js';
import type { RuntimeRegistry } from '../../src/actors/runtime-registry.js';

/** A runtime's registry with its maps and its tools, and nothing else. */
function registries() {
  const members = {
    operators: new Map<string, unknown>(),
    operatorVersions: new Map<string, string>(),
    agents: new Map<string, unknown>(),
    agentVersions: new Map<string, string>(),
    policies: new Map<string, unknown>(),
    tools: createToolRegistry(),
  };
  return { members, registry: members as unknown as RuntimeRegistry };
}

const op = () => Promise.resolve(null);
const writer = {
  name: 'writer',
  model: 'gpt-x',
  provider: { baseURL: 'http://127.0.0.1:9/v1/', apiKey: 'k' },
  systemPrompt: 'Write.',
};
const allow = () => ({ allow: true as const });

describe('checkVersion', () => {
  it('takes a non-empty string or nothing', () => {
    expect(checkVersion(undefined, 'operator')).toBeUndefined();
    expect(checkVersion({}, 'agent')).toBeUndefined();
    expect(checkVersion({ version: '2' }, 'agent')).toBe('2');
  });

  it('refuses anything else, showing the call to write', () => {
    try {
      checkVersion({ version: 2 as unknown as string }, 'operator');
      expect.unreachable();
    } catch (error) {
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues).toEqual([
        {
          path: 'version',
          message: 'must be a non-empty string, e.g. runtime.operator(…, { version: "2" }), got 2',
        },
      ]);
    }
  });
});

describe('registering one by one', () => {
  it('keeps an operator and its version; a new registration without one drops the old version', () => {
    const { registry, members } = registries();
    registerOperator(registry, 'fetch', op, { version: '1' });
    expect(members.operators.get('fetch')).toBe(op);
    expect(members.operatorVersions.get('fetch')).toBe('1');
    registerOperator(registry, 'fetch', op, undefined);
    expect(members.operatorVersions.has('fetch')).toBe(false);
  });

  it('refuses an operator without a name or a function', () => {
    const { registry } = registries();
    expect(() => registerOperator(registry, '', op, undefined)).toThrow(
      'register an operator as runtime.operator(name, async (ctx) => result)',
    );
    expect(() => registerOperator(registry, 'x', 'nope' as never, undefined)).toThrow(
      InputValidationError,
    );
  });

  it('refuses a second policy or agent of one name', () => {
    const { registry, members } = registries();
    registerPolicy(registry, 'gdpr', allow, { appliesTo: { tags: ['pii'] } });
    expect(members.policies.has('gdpr')).toBe(true);
    expect(() => registerPolicy(registry, 'gdpr', allow, undefined)).toThrow(ConfigurationError);
    const agent = defineAgent(writer);
    registerAgent(registry, agent, { version: '3' });
    expect(members.agentVersions.get('writer')).toBe('3');
    expect(() => registerAgent(registry, agent, undefined)).toThrow(
      'an agent named "writer" is already registered; give each agent its own name',
    );
  });
});

describe('registerAll', () => {
  it("registers what the runtime's options name", () => {
    const { registry, members } = registries();
    const tool = defineTool({ name: 'lookup', input: z.object({}), run: () => 'x' });
    registerAll(registry, {
      operators: { fetch: op },
      tools: [tool],
      agents: [defineAgent(writer)],
      policies: { open: allow, tagged: { check: allow, appliesTo: { tags: ['pii'] } } },
    });
    expect([...members.operators.keys()]).toEqual(['fetch']);
    expect(members.tools.get('lookup')).toBeDefined();
    expect([...members.agents.keys()]).toEqual(['writer']);
    expect([...members.policies.keys()]).toEqual(['open', 'tagged']);
  });
});
