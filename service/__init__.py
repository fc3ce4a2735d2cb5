"""HTTP and CLI for mlx-tandem: routes by feature (chat, speech, admin, pi), the app factory, `tandem`.

Never touches MLX arrays; reaches the engine and speech through the Protocols in service/seams.py.
See ARCHITECTURE.md for the map.
"""

__all__: list[str] = []
