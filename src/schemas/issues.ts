import type { z } from 'zod';
import type { ValidationIssue } from '../errors.js';
import { formatPath } from '../internal/json.js';

/** Converts zod issues into runtime validation issues with formatted paths (`steps[2].dependsOn[0]`). */
export function zodIssuesToValidationIssues(
  issues: readonly z.core.$ZodIssue[],
  root = '',
): ValidationIssue[] {
  return issues.map((issue) => ({ path: formatPath(root, issue.path), message: issue.message }));
}
