"""Agent scaffolds. The in-house SWE agent:

- the tool-call text format and its parser live in `stacx.toolcalls` (below the engines:
  the model gateway parses the same format);
- `tools`: bash / view / create / str_replace / submit inside a Sandbox;
- `chat`: token-exact transcript pieces from the model's chat template;
- `policies`: who acts on a turn (an Engine, or a script: oracle, null), and the per-turn
  executor hook (DAgger's beta-mixture);
- `loop`: `run_agent`, the one episode loop (TurnGenerated / ToolCalled / ToolReturned) over a
  tool adapter, and `LoopAgent`, that loop behind the `Agent` port (stacx.ports) the episode
  runner drives; `swe`: the SWE tools' adapter.

Installed scaffolds (`installed`): black-box agent programs from PyPI (mini-swe-agent, the
OpenHands SDK) run
unmodified in the task container on network=none, calling the model through the gateway
(stacx.inference.gateway), which records their turns.

The ReTool adapter (`retool`, its texts in `retool_prompt`): math reasoning that runs Python
in the sandbox and ends with a ``\\boxed{}`` answer, on the same loop, framing and policies.
"""
