"""`agent_success`: success rate and unbiased pass@k of agent episodes, as an `evaluate` metric.

Load it offline with `trl_agents.metrics.load_metric("agent_success")` (or `evaluate.load` of this folder).
"""

import datasets
import evaluate

from trl_agents.metrics import mean_pass_at_k

_DESCRIPTION = """
Success rate and pass@k of agent episodes grouped by task. The input holds, for every task, whether each of its
episodes solved it. `success_rate` is the mean over tasks of the fraction of solved episodes (the fraction of solved
episodes when every task has as many); `success_rate_stderr` its standard error over tasks (episodes of one task are
not independent, so tasks are the unit); `pass_at_k` is the unbiased estimator
1 - C(n-c, k) / C(n, k) of Chen et al. (2021), averaged over tasks, for every k of `k` (default: 1, 2, 4, ... and n,
where n is the fewest episodes any task has). A task with a single episode gives no pass@k.
"""

_KWARGS_DESCRIPTION = """
Args:
    successes (`list[list[bool]]`): For every task, one entry per episode: whether it solved the task.
    k (`list[int]`, *optional*): The k to report pass@k for (each at most the episodes of every task).

Returns:
    success_rate (`float`), success_rate_stderr (`float`), and `pass_at_{k}` (`float`) for each k.

Example:
    >>> from trl_agents.metrics import load_metric
    >>> metric = load_metric("agent_success")
    >>> metric.compute(successes=[[True, False, False, False]], k=[1, 4])
    {'success_rate': 0.25, 'success_rate_stderr': 0.0, 'pass_at_1': 0.25, 'pass_at_4': 1.0}
"""

_CITATION = """
@article{chen2021evaluating,
  title={Evaluating Large Language Models Trained on Code},
  author={Chen, Mark and Tworek, Jerry and Jun, Heewoo and others},
  journal={arXiv preprint arXiv:2107.03374},
  year={2021}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AgentSuccess(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"successes": datasets.Sequence(datasets.Value("bool"))}),
        )

    def _compute(self, successes, k=None):
        if not successes or any(len(task) == 0 for task in successes):
            raise ValueError("agent_success: `successes` needs at least one task, each with at least one episode")
        per_task = [sum(task) / len(task) for task in successes]
        mean = sum(per_task) / len(per_task)
        variance = sum((rate - mean) ** 2 for rate in per_task) / max(len(per_task) - 1, 1)
        scores = {
            "success_rate": mean,
            "success_rate_stderr": (variance / len(per_task)) ** 0.5,
        }
        return {**scores, **mean_pass_at_k(successes, k)}
