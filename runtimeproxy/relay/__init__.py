"""The data path: each client connection mirrored frame by frame onto a backend connection
(connection, the asyncio side; frame_machine, the frame and stream state machine without I/O;
held_calls, the calls a hook layer claims; options, what every connection shares), the calls on
it (streams), which CRI methods stream and which are lifecycle calls (methods), and the seam
where a hook layer holds a call back (call_interceptor). It never applies policy.

May import the standard library, third-party libraries, runtimeproxy.api, runtimeproxy.common
and runtimeproxy.wire; never the hook layer (runtimeproxy.dispatch), runtimeproxy.proxy or
runtime-hooks.
"""
