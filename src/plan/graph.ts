/** Pure graph helpers on plans: dependents, a stable topological order, cycle finding. */
import { InvariantError } from '../errors.js';
import type { Plan } from './schema.js';

/** One dependency cycle: `cycle` in dependsOn order (each id depends on the next, the last on the first). */
export interface DependencyCycle {
  cycle: string[];
  /** Every id in the same strongly connected component (it may hold more cycles), in `ids` order. */
  component: string[];
}

/**
 * Finds the dependency cycles among `ids`: one per strongly connected component, starting at the
 * component's first id in `ids` order and following the shortest way back to it. Deterministic.
 * Dependencies that are not in `ids` are ignored.
 */
export function findDependencyCycles(
  ids: readonly string[],
  dependsOn: (id: string) => readonly string[],
): DependencyCycle[] {
  const position = new Map<string, number>();
  ids.forEach((id, i) => {
    if (!position.has(id)) position.set(id, i);
  });
  const edges = (id: string): string[] => dependsOn(id).filter((dep) => position.has(dep));

  // Tarjan's algorithm, iterative so a long chain cannot overflow the stack.
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  let counter = 0;
  const open = (id: string): void => {
    index.set(id, counter);
    low.set(id, counter);
    counter++;
    stack.push(id);
    onStack.add(id);
  };
  for (const root of position.keys()) {
    if (index.has(root)) continue;
    open(root);
    const work: { id: string; deps: string[]; next: number }[] = [
      { id: root, deps: edges(root), next: 0 },
    ];
    while (work.length > 0) {
      const top = work[work.length - 1]!;
      if (top.next < top.deps.length) {
        const dep = top.deps[top.next++]!;
        if (!index.has(dep)) {
          open(dep);
          work.push({ id: dep, deps: edges(dep), next: 0 });
        } else if (onStack.has(dep)) {
          low.set(top.id, Math.min(low.get(top.id)!, index.get(dep)!));
        }
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent !== undefined) low.set(parent.id, Math.min(low.get(parent.id)!, low.get(top.id)!));
      if (low.get(top.id) === index.get(top.id)) {
        const component: string[] = [];
        let member: string;
        do {
          member = stack.pop()!;
          onStack.delete(member);
          component.push(member);
        } while (member !== top.id);
        components.push(component);
      }
    }
  }

  const cycles: DependencyCycle[] = [];
  for (const members of components) {
    const inComponent = new Set(members);
    const ordered = [...members].sort((a, b) => position.get(a)! - position.get(b)!);
    const start = ordered[0]!;
    if (members.length === 1 && !edges(start).includes(start)) continue;
    cycles.push({ cycle: shortestCycleThrough(start, edges, inComponent), component: ordered });
  }
  return cycles.sort((a, b) => position.get(a.cycle[0]!)! - position.get(b.cycle[0]!)!);
}

/** Breadth-first search from `start` back to itself, inside one strongly connected component. */
function shortestCycleThrough(
  start: string,
  edges: (id: string) => string[],
  inComponent: ReadonlySet<string>,
): string[] {
  const parent = new Map<string, string>();
  const queue = [start];
  for (let head = 0; head < queue.length; head++) {
    const id = queue[head]!;
    for (const dep of edges(id)) {
      if (!inComponent.has(dep)) continue;
      if (dep === start) {
        const cycle = [id];
        for (let at = id; at !== start;) {
          at = parent.get(at)!;
          cycle.push(at);
        }
        return cycle.reverse();
      }
      if (!parent.has(dep)) {
        parent.set(dep, id);
        queue.push(dep);
      }
    }
  }
  throw new InvariantError(`step "${start}" is in a cycle component but no cycle leads back to it`);
}

/** Step id → ids of the steps that depend on it, in plan order. Every step id is a key. */
export function dependentsOf(plan: Plan): Record<string, string[]> {
  const out = new Map<string, string[]>(plan.steps.map((step) => [step.id, []]));
  for (const step of plan.steps) {
    for (const dep of step.dependsOn) out.get(dep)?.push(step.id);
  }
  return Object.fromEntries(out);
}

/** Step ids so that every step comes after its dependencies; plan order among steps that are free. */
export function topologicalOrder(plan: Plan): string[] {
  const position = new Map(plan.steps.map((step, i) => [step.id, i]));
  const waitingOn = plan.steps.map((step) => new Set(step.dependsOn).size);
  const dependents = dependentsOf(plan);
  // Ready steps by plan position, kept sorted so the smallest position is taken first.
  const ready: number[] = [];
  const insert = (i: number): void => {
    let lo = 0;
    let hi = ready.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ready[mid]! < i) lo = mid + 1;
      else hi = mid;
    }
    ready.splice(lo, 0, i);
  };
  waitingOn.forEach((count, i) => {
    if (count === 0) insert(i);
  });
  const order: string[] = [];
  while (ready.length > 0) {
    const step = plan.steps[ready.shift()!]!;
    order.push(step.id);
    for (const dependent of new Set(dependents[step.id])) {
      const i = position.get(dependent)!;
      if (--waitingOn[i]! === 0) insert(i);
    }
  }
  if (order.length !== plan.steps.length) {
    throw new InvariantError(
      'topologicalOrder: the plan has a dependency cycle (parsePlan refuses those)',
    );
  }
  return order;
}

// Each plan's steps by id, computed once per plan object: a unit of a run of 1,000 steps looks
// its step up without walking the plan.
const stepsById = new WeakMap<Plan, Map<string, Plan['steps'][number]>>();

/** The step of `plan` with id `stepId`; undefined when it has none. */
export function planStep(
  plan: Plan,
  stepId: string | undefined,
): Plan['steps'][number] | undefined {
  let byId = stepsById.get(plan);
  if (byId === undefined) {
    byId = new Map(plan.steps.map((s) => [s.id, s]));
    stepsById.set(plan, byId);
  }
  return stepId === undefined ? undefined : byId.get(stepId);
}
