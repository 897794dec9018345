"""The names verl_ext registers in verl (agent loops, the CPU rollout) and the import paths behind them: a leaf, read
by the plugin's entry point, loop routing and the preflight alike."""

from __future__ import annotations

CPU_ROLLOUT_NAME = "verl_ext_cpu"
AGENT_LOOP_NAME = "verl_ext_tool_agent"
AGENT_LOOP_PATH = "verl_ext.plugin.agent_loop.VerlExtToolAgentLoop"
AUDIT_LOOP_NAME = "verl_ext_audited_tool_agent"
AUDIT_LOOP_PATH = "verl_ext.plugin.audit_loop.AuditedToolAgentLoop"
GATEWAY_LOOP_NAME = "verl_ext_gateway_agent"
GATEWAY_LOOP_PATH = "verl_ext.plugin.gateway_loop.VerlExtGatewayAgentLoop"
CPU_ADAPTER_PATH = "verl_ext.engines.cpu.CPUServerAdapter"
