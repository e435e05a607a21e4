"""Layer 3: the binding that trains agentbolt agents with verl 0.9.1's V1 trainer.

verl-free parts (importable and testable without verl, Ray or a GPU):

- :mod:`.gateway`: :class:`~.gateway.GatewayControl`, the interface the binding drives.
- :mod:`.rollouts`: :class:`~.rollouts.RolloutExecutor`, one verl session → one agentbolt
  rollout in the store → transitions → agent-loop outputs.
- :mod:`.coordinator`: :class:`~.coordinator.WeightSyncCoordinator` (gateway upstreams,
  pause/drain/resume, resources) and :class:`~.coordinator.AgentboltTrainerMixin` (verl's
  trainer hooks, LightningRL's advantage step).

verl parts (imported only inside verl's processes): :mod:`.agent_loop` (the agent loop),
:mod:`.trainer` (the ``agentbolt_sync`` and ``agentbolt_colocate_async`` trainers, TransferQueue
I/O), :mod:`.worker_hooks` (Ray worker hook) and
:mod:`.entrypoint` (compose, write the task files, run). See the package README.
"""
