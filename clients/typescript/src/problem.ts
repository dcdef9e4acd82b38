/**
 * An error answer of the API (RFC 9457 problem+json, docs/api.md) as an exception: what
 * went wrong (`type`, `code`), where (`field`), when to try again (`retryAfter`), and
 * the request id the service's log lines carry.
 */
export class ProblemError extends Error {
  /** `/problems/<code>`, e.g. `/problems/not-a-member`. */
  readonly type: string;
  /** The last segment of `type`, e.g. `not-a-member`. */
  readonly code: string;
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  /** The JSON path, query parameter or path segment at fault, if one is. */
  readonly field: string | null;
  /** The request's `x-request-id`. */
  readonly requestId: string | null;
  /** Seconds to wait before trying again (`Retry-After` of a 429 or 503), if given. */
  readonly retryAfter: number | null;

  constructor(problem: Problem, retryAfter: number | null = null) {
    super(`${problem.status} ${problem.type}: ${problem.detail}`);
    this.name = 'ProblemError';
    this.type = problem.type;
    this.code = problem.type.split('/').pop() ?? problem.type;
    this.status = problem.status;
    this.title = problem.title;
    this.detail = problem.detail;
    this.field = problem.field ?? null;
    this.requestId = problem.requestId ?? null;
    this.retryAfter = retryAfter;
  }

  /** The problem an error response carries (a body that is not a problem still gives one). */
  static async of(response: Response): Promise<ProblemError> {
    const header = response.headers.get('retry-after');
    const seconds = header === null ? NaN : Number(header);
    const retryAfter = Number.isFinite(seconds) ? seconds : null;
    const text = await response.text();
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
    if (isProblem(body)) return new ProblemError(body, retryAfter);
    return new ProblemError(
      {
        type: `/problems/http-${response.status}`,
        title: response.statusText,
        status: response.status,
        detail: text.slice(0, 200),
        requestId: response.headers.get('x-request-id'),
      },
      retryAfter,
    );
  }
}

/** The body of every 4xx and 5xx of the API. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  field?: string | null;
  requestId?: string | null;
}

function isProblem(body: unknown): body is Problem {
  if (typeof body !== 'object' || body === null) return false;
  const b = body as Record<string, unknown>;
  return typeof b.type === 'string' && typeof b.status === 'number';
}
