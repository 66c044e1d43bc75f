"""docker-compose.yml, the Dockerfile and deploy/ wire the stack the way Sluicegate relies on.

Every rule is a check over the parsed files. The real files must pass every check, and every
check must reject a copy of the files broken in the way that check guards against, so that
none of them can pass vacuously. The checks read the code as well: the roles of the
``sluicegate`` command, the fields of ``Settings`` and the metrics the processes define.

- ``files``: the files read the way Compose, nginx and Docker read them.
- ``metrics``: the metrics the code exports, and the ones a PromQL expression reads.
- ``compose_checks``: the checks of docker-compose.yml, the Dockerfile and .dockerignore.
- ``deploy_checks``: the checks of deploy/ (gateway, Prometheus, Grafana).
- ``test_compose``: the real files pass every check.
- ``breaking``: ways to break a copy of the files, each for the check it must fail.
- ``test_broken_copies``, ``test_broken_deploy``: a copy broken for each check fails it.
"""
