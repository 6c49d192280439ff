"""The host <-> cell contract: what the daemon speaks and what the host side needs to speak it.

`schemas` (request and response shapes) and `environment` (the env allow-list) are shared by
both sides and import nothing heavy; `argv` builds the daemon's command line; `client` and
`health` are the host side (httpx). `isolation`, `manager` and `router` import this package,
never the in-cell `sandcell.daemon`.
"""
