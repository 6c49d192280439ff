"""The substituting egress proxy of SPEC §17: a CA per sandbox (`authority`), the upstream's
checks (`upstream`), placeholder rules and streaming rewrites (`rewrite`), and the HTTP/1.1
relay that applies them to a CONNECT towards a host that one of the sandbox's secrets names
(`intercept`). Every other host stays an untouched tunnel."""
