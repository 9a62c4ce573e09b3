"""The `kubernetes` backend (extra `kubernetes`): sandboxes as pods.

- `session`: `KubernetesSession`, the hooks only;
- `options`: the session's options, what each means and their checks;
- `config`: credentials and the cluster, loaded by `kubernetes_asyncio`;
- `client`: HTTP calls, watches and exec WebSockets over one aiohttp session;
- `channels`: the exec channel protocol (v5, v4);
- `execs`: a command's exec under the toolkit's wrapper (`KubeProcess`, the handle: a
  `Process`), kills by a second exec;
- `pods`: manifest, create, watch until running, attach, delete;
- `runner_link`: the runner in the pod (`runner=True`), put there and reached by exec;
- `durable`: detach and resume (the pod by name and uid, the lease file in the pod;
  exec processes cannot be reattached: killed by tag);
- `files`: files through exec; `scripts`: the shell snippets; `errors`: Status
  objects as our errors; `bounds`: every peer-sent size and deadline.

Facts and sources: docs/providers.md, "Kubernetes".
"""

from .session import KubernetesSession

__all__ = ["KubernetesSession"]
