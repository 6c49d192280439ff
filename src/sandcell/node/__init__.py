"""`sandcell node` (SPEC §18): the node API routers call, in front of this host's cells.

A router keeps minting every request token; a node relays bytes to its local cells and never
holds a session private key on that path. `server` answers routers only (mutual TLS under the
cluster CA), `relay` pipes a `CONNECT /cells/<id>` to the cell's daemon socket, `control`
takes the manager's calls, `heartbeat` keeps the node in the roster, `run` puts them
together; on a router's side, `dial` is the relay's (used by `cellapi.client.dialer`) and
`client` the control calls'.
"""
