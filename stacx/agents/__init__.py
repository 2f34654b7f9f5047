"""Agents: the one in-house loop (`loop`) over tool adapters (`swe` with `tools` and `formats`,
`retool`, `mle`), its token-exact transcript (`chat`) and who acts (`policies`: an Engine or a
script); installed black-box scaffolds (`installed`, `scaffold_spec`, `exec_relay`) that call the
model through the gateway. The tool-call format itself is stacx.toolcalls'.

Design: docs/agents.md
"""
