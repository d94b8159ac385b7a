import { describe, expect, it } from 'vitest';
import { classifyTool, toolNameWords, type ToolClass } from '../../src/tools/classify.js';

describe('classifyTool', () => {
  it.each<[string, ToolClass]>([
    // The five cases the seed requires.
    ['GMAIL_SEND_EMAIL', 'external'],
    ['mcp:upload_to_composio', 'external'],
    ['mcp:core_memory_append', 'memory'],
    ['mcp:write_local_file', 'local'],
    ['COMPOSIO_SEARCH_WEB', 'read_only'],
    // Memory, local, read verbs, write verbs.
    ['archival_memory_insert', 'memory'],
    ['archival_memory_search', 'memory'],
    ['memory_delete', 'memory'],
    ['mcp__letta__core_memory_replace', 'memory'],
    ['local_shell', 'local'],
    ['read_local_file', 'local'],
    ['GITHUB_LIST_REPOS', 'read_only'],
    ['GMAIL_GET_PROFILE', 'read_only'],
    ['weather.lookup', 'read_only'],
    ['find-flights', 'read_only'],
    ['QUERY_DB', 'read_only'],
    ['GITHUB_CREATE_ISSUE', 'external'],
    ['get_or_create_user', 'external'],
    ['STRIPE_PAY_INVOICE', 'external'],
    ['SEARCH_AND_DELETE', 'external'],
    // camelCase and acronyms.
    ['searchWeb', 'read_only'],
    ['getUserProfile', 'read_only'],
    ['sendEmail', 'external'],
    ['HTTPGetStatus', 'read_only'],
    ['writeLocalFile', 'local'],
    ['coreMemoryAppend', 'memory'],
    // Unknown: conservative.
    ['frobnicate', 'external'],
    ['GMAIL', 'external'],
    ['mcp:budget', 'external'],
    // "get" must be a word, not a substring.
    ['target_practice', 'external'],
  ])('%s → %s', (name, expected) => {
    expect(classifyTool(name)).toBe(expected);
  });

  it('takes the namespace as an argument as well as a name prefix', () => {
    expect(classifyTool('core_memory_append', 'mcp')).toBe('memory');
    expect(classifyTool('upload_to_composio', 'mcp')).toBe('external');
    expect(classifyTool('read_file', 'filesystem')).toBe('local');
    expect(classifyTool('read_file')).toBe('read_only');
    expect(classifyTool('SEARCH_WEB', 'composio')).toBe('read_only');
  });

  it('lets metadata decide: class wins, then readOnly and MCP readOnlyHint', () => {
    expect(classifyTool('GMAIL_SEND_EMAIL', undefined, { class: 'read_only' })).toBe('read_only');
    expect(classifyTool('COMPOSIO_SEARCH_WEB', undefined, { class: 'external' })).toBe('external');
    expect(classifyTool('thing', undefined, { class: 'memory' })).toBe('memory');
    expect(classifyTool('thing', undefined, { class: 'bogus' })).toBe('external');
    expect(classifyTool('thing', undefined, { readOnly: true })).toBe('read_only');
    expect(classifyTool('thing', 'mcp', { annotations: { readOnlyHint: true } })).toBe('read_only');
    expect(classifyTool('GET_THING', 'mcp', { annotations: { readOnlyHint: false } })).toBe(
      'read_only',
    );
    expect(classifyTool('thing', 'mcp', { readOnly: 'yes', annotations: null })).toBe('external');
  });

  it('splits names into words on separators and camelCase', () => {
    expect(toolNameWords('mcp:writeLocalFile')).toEqual(['mcp', 'write', 'local', 'file']);
    expect(toolNameWords('HTTPRequest.v2/get-ITEM')).toEqual([
      'http',
      'request',
      'v2',
      'get',
      'item',
    ]);
  });
});
