//! agentbox's exit statuses, in one place: every face and the report use these.

/// `run`, `chat`, `demo`, `eval`: the tests pass (or, with no test command, the model finished).
pub const PASSED: u8 = 0;
/// The tests fail after the model's last turn.
pub const TESTS_FAIL: u8 = 1;
/// A usage error: a flag, a value or a combination agentbox refuses.
pub const USAGE: u8 = 2;
/// The model ran out of steps, or repeated itself.
pub const STEP_LIMIT: u8 = 3;
/// The run failed (the model's API, the sandbox, setup).
pub const ERROR: u8 = 4;
/// `exec`, `shell`: the command passed its timeout (as `timeout(1)` says it).
pub const TIMED_OUT: u8 = 124;
/// `exec`, `shell`: agentbox itself failed, not the command (Docker's `run` uses 125 for the same).
pub const AGENTBOX_ERROR: u8 = 125;
