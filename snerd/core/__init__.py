"""snerd.core: the pure decision layer.

Everything a daemon decides — what to dispatch, when to retry, what to write to a log, what to
send to the SDK — is decided here, by plain objects driven with typed events and answering with
typed effects. Nothing in this package performs I/O, reads a clock, draws a random number or
starts a thread: an import-linter contract fails the build if it tries. Time arrives only as the
numbers carried by `Now`.
"""
