/** How the CLI prints runs, events and ledgers: short human lines, or JSON with `--json`. */
import type { LedgerEntry } from '../persistence/ledger.js';
import type { StoredRunEvent } from '../persistence/snapshot-store.js';
import type { RunReport, RunUsage } from '../runtime.js';
import { ExitCode } from './exit-codes.js';

/** The exit code a run's state stands for: 0 succeeded (or still running), 1 failed, 3 waiting, 4 budget, 5 cancelled. */
export function exitCodeOf(report: Pick<RunReport, 'status' | 'summary'>): ExitCode {
  switch (report.status) {
    case 'failed':
      return report.summary.reason === 'budget_exceeded'
        ? ExitCode.budgetExceeded
        : ExitCode.failed;
    case 'waiting':
      return ExitCode.waiting;
    case 'cancelled':
      return ExitCode.cancelled;
    default:
      return ExitCode.ok;
  }
}

/** Quotes `word` for a POSIX shell when it needs it. */
export function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

/** `flujo resume <runId> <job-module>`, ready to paste. */
export function resumeCommand(runId: string, modulePath: string, extra: readonly string[] = []) {
  return ['flujo', 'resume', runId, modulePath, ...extra].map(shellQuote).join(' ');
}

const time = (at: unknown): string =>
  typeof at === 'number' && at > 0 ? new Date(at).toISOString() : '-';
const clock = (at: unknown): string => time(at).slice(11, 23);

function preview(value: unknown, max = 80): string {
  const text = JSON.stringify(value) ?? 'null';
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** The steps waiting for approval. */
export const waitingSteps = (report: RunReport): string[] =>
  report.steps.filter((s) => s.status === 'WAITING_APPROVAL').map((s) => s.stepId);

/** One progress line for a step state change, or null for other events. */
export function progressLine(e: StoredRunEvent): string | null {
  const d = e.data as Record<string, unknown>;
  if (e.type === 'turn.committed') {
    return `  ${clock(d['at'])}  ${String(d['stepId'])}: turn ${Number(d['turn']) + 1} committed (history ${String(d['cursor'])} messages)`;
  }
  if (e.type !== 'step.changed') return null;
  const attempt = d['to'] === 'RUNNING' ? ` (attempt ${String(d['attempt'])})` : '';
  return `  ${clock(d['at'])}  ${String(d['stepId'])}: ${String(d['from'])} → ${String(d['to'])}${attempt}`;
}

/** One line per event for `flujo events`. */
export function eventLine(e: StoredRunEvent): string {
  const d = e.data as Record<string, unknown>;
  const s = (k: string) => String(d[k]);
  let detail: string;
  switch (e.type) {
    case 'run.created':
      detail = `plan "${s('plan')}"`;
      break;
    case 'step.changed':
      detail = `${s('stepId')}: ${s('from')} → ${s('to')} (attempt ${s('attempt')})`;
      break;
    case 'run.status':
      detail = `${d['from'] === null ? '(new)' : s('from')} → ${s('to')}`;
      break;
    case 'gate.approved':
    case 'gate.rejected':
      detail = `${s('stepId')} by ${s('by')}${d['comment'] === undefined ? '' : `: ${preview(d['comment'])}`}`;
      break;
    case 'step.succeeded':
      detail = `${s('stepId')} attempt ${s('attempt')}: ${preview(d['output'])}`;
      break;
    case 'turn.committed':
      detail = `${s('stepId')} attempt ${s('attempt')} turn ${s('turn')}: history ${s('cursor')} messages`;
      break;
    case 'step.failed': {
      const err = (d['error'] ?? {}) as Record<string, unknown>;
      detail = `${s('stepId')} attempt ${s('attempt')}: ${String(err['code'])}: ${String(err['message']).split('\n')[0]}`;
      break;
    }
    case 'run.finished':
      detail = `${s('status')}; produced ${Object.keys(d['produced'] ?? {}).join(', ') || 'nothing'}${
        d['blockedStep'] == null ? '' : `; blocked at ${s('blockedStep')}`
      }${d['reason'] == null ? '' : ` (${s('reason')})`}`;
      break;
    default: {
      const rest = Object.fromEntries(
        Object.entries(d).filter(([k]) => k !== 'type' && k !== 'at'),
      );
      detail = Object.keys(rest).length === 0 ? '' : preview(rest, 160);
    }
  }
  return `${time(d['at'])}  ${e.type.padEnd(14)} ${detail}`.trimEnd();
}

/** What a run came to: status, produced outputs, blocked step and reason, and what to do next. */
export function summaryLines(report: RunReport, resume: string | undefined): string[] {
  const { runId, summary } = report;
  const lines = [`run ${runId} ${report.status}`];
  const produced = Object.keys(summary.produced);
  lines.push(`  produced: ${produced.length === 0 ? 'nothing' : produced.join(', ')}`);
  if (summary.blockedStep !== null) lines.push(`  blocked at: ${summary.blockedStep}`);
  if (summary.reason !== null) {
    lines.push(`  reason: ${summary.reason}${detailText(summary.detail)}`);
  }
  const waiting = waitingSteps(report);
  for (const step of waiting) {
    lines.push(
      `  waiting for approval: ${step} (flujo approve ${shellQuote(runId)} ${step} --by NAME, or flujo reject …)`,
    );
  }
  if (resume !== undefined && (waiting.length > 0 || report.status === 'failed')) {
    lines.push(`  then continue with: ${resume}`);
  }
  return lines;
}

function detailText(detail: unknown): string {
  if (detail === null || detail === undefined) return '';
  if (typeof detail === 'object' && !Array.isArray(detail)) {
    const d = detail as Record<string, unknown>;
    if (typeof d['budget'] === 'string') {
      return ` (${d['budget']}: limit ${String(d['limit'])}, used ${String(d['used'])})`;
    }
    if (typeof d['message'] === 'string') return `: ${d['message'].split('\n')[0]}`;
  }
  return `: ${preview(detail)}`;
}

/** `flujo status`: the run, its steps, and its summary. */
export function statusLines(report: RunReport): string[] {
  const width = Math.max(...report.steps.map((s) => s.stepId.length), 4);
  const lines = [
    `run ${report.runId}  plan "${report.planName}"  ${report.status}  (version ${report.version}, updated ${time(report.updatedAt)})`,
  ];
  for (const s of report.steps) {
    const extra = [
      s.attempt > 0 ? `attempt ${s.attempt}` : '',
      s.reason === null ? '' : s.reason,
      s.approval === null ? '' : `approved by ${s.approval.by}`,
      s.rejection === null ? '' : `rejected by ${s.rejection.by}`,
    ].filter((x) => x !== '');
    lines.push(`  ${s.stepId.padEnd(width)}  ${s.status.padEnd(16)} ${extra.join(', ')}`.trimEnd());
  }
  return lines.concat(summaryLines(report, undefined).slice(1));
}

/** `flujo ledger`: one row per tool call. */
export function ledgerLines(entries: readonly LedgerEntry[]): string[] {
  if (entries.length === 0) return ['no tool calls recorded'];
  const rows = [
    ['CALL', 'TOOL', 'STATE', 'RUNS', 'UPDATED'],
    ...entries.map((e) => [
      e.callId.slice(0, 12),
      e.tool,
      e.state,
      String(e.runs),
      time(e.updatedAt),
    ]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) =>
    r
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd(),
  );
}

const usd = (microUsd: number): string => `$${(microUsd / 1_000_000).toFixed(6)}`;

/** The lines of `flujo usage`: one per reservation (step, turn), then the run's totals. */
export function usageLines(usage: RunUsage): string[] {
  const { reservations, totals } = usage;
  const lines: string[] = [];
  if (reservations.length === 0) lines.push('no model calls recorded');
  else {
    const rows = [
      ['STEP', 'TURN', 'RESERVED', 'SPENT', 'COST', 'RECONCILED', 'AT'],
      ...reservations.map((r) => [
        r.stepId,
        String(r.turn),
        `${r.reservedTokens} tok ${usd(r.reservedMicroUsd)}`,
        r.charged === null ? '-' : `${r.charged.inputTokens}+${r.charged.outputTokens} tok`,
        r.charged === null ? '-' : usd(r.charged.microUsd),
        r.outcome === null ? `open (${r.state})` : reconciledAs(r.outcome),
        time(r.reconciledAt ?? r.createdAt),
      ]),
    ];
    const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
    for (const r of rows)
      lines.push(
        r
          .map((c, i) => c.padEnd(widths[i]!))
          .join('  ')
          .trimEnd(),
      );
  }
  const limit = (n: number | null, unit: (v: number) => string) => (n === null ? 'none' : unit(n));
  lines.push(
    `total: spent ${totals.spentTokens} tokens ${usd(totals.spentMicroUsd)}; reserved now ${totals.reservedTokens} tokens ${usd(totals.reservedMicroUsd)}; budgets maxTokens ${limit(totals.maxTokens, String)}, maxCostUsd ${limit(totals.maxMicroUsd, (v) => usd(v).slice(1))}`,
  );
  return lines;
}

function reconciledAs(outcome: string): string {
  switch (outcome) {
    case 'usage':
      return "usage (the provider's)";
    case 'baseline':
      return 'baseline (sent, no reply)';
    default:
      return 'nothing sent';
  }
}
