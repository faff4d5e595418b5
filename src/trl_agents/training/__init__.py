"""The stages of a training iteration after the rollout, one module each, in the order they run
(docs/concepts/training_loop.md; `AgentGRPOTrainer._generate_and_score_completions` calls them in this order):

| module | stage |
|---|---|
| `tasks` | dataset rows are tasks; TRL's generation batch back into its tasks |
| (`trl_agents.rollout`) | the rollout: the engine, its topology, the environments and the generator |
| `one_step_off` | `max_staleness=1`: the next rollout generating in the background while this one trains |
| `signal_phase` | model signals on the rollout's healthy episodes (and mid-rollout for a topology) |
| `grsd_phase` | GRSD's signal phase: reflections, their judge, the guidance and the student's scores (its trainer runs it) |
| `credit_phase` | healthy and filtered groups; the value each recorded step is trained with |
| `rows` | training rows (step or conversation) with their advantages and signals |
| `batch` | padded tensors, filler rows, micro-batches, the loss mask |
| `forward` | forwards over training rows: length groups, the token budget, one `token_logps` |
| `loss` | loss chunks, backward in parts, the auxiliary-loss normaliser, the importance-sampling ratio |
| `metrics` | rollout metrics over processes, the completions table, episode transcripts |

Each module is plain functions (and the phase classes `SignalPhase`, `GRSDPhase`) over trajectories, rows and
tensors; none imports a trainer. The TRL adapter, `trl_agents.trainers.agent_grpo`, is the only place that touches TRL's private surface.
"""
