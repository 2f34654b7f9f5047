"""Agent scaffolds. The in-house SWE agent:

- `toolcalls`: the tool-call text format and its forgiving parser;
- `tools`: bash / view / create / str_replace / submit inside a Sandbox;
- `chat`: token-exact transcript pieces from the model's chat template;
- `policies`: who acts on a turn (an Engine, or a script: oracle, null), and the per-turn
  executor hook (DAgger's beta-mixture);
- `loop`: `run_agent`, the episode loop that emits TurnGenerated / ToolCalled / ToolReturned,
  and `SweAgent`, that loop behind the `Agent` port (stacx.ports) the episode runner drives.

The ReTool agent (`retool`, its texts in `retool_prompt`): math reasoning that runs Python in
the sandbox and ends with a ``\\boxed{}`` answer, on the same chat framing and policies.
"""
