-- scaffold_failures: one row per attempt whose installed scaffold exited non-zero before any
-- model call was answered, or could not start (InfraFailed 'scaffold', never scored), with what the
-- scaffold said: its exit code and the tail of its stderr (ScaffoldExited), and that tail's
-- last non-blank line (usually the error).
CREATE OR REPLACE VIEW scaffold_failures AS
SELECT x.episode_id,
       x.task_id,
       x.attempt,
       x.will_retry,
       s.scaffold,
       s.exit_code,
       list_filter(string_split(s.stderr_tail, chr(10)), lambda l: trim(l) <> '')[-1] AS stderr_last_line,
       s.stderr_tail,
       x.message,
       x.ts
FROM infra_failed x
JOIN scaffold_exited s USING (episode_id)
WHERE x.failure_kind = 'scaffold';
