"""Turns operations written once (effect generators, see `protocol`) into real methods.

`@operation` on a generator method of a shared base class makes it, on a `SyncBound` object,
a plain method that runs the generator on a `SyncTransport`, and on an `AsyncBound` object a
coroutine method that runs it on an `AsyncTransport`. `@constructor` and `@classoperation` do
the same for class methods: they open a transport from the call's `url`/`api_key`/`config`
arguments; a constructor hands it to the new object, a class operation closes it after.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sandcell.client.config import ClientConfig
from sandcell.client.protocol import Op

if TYPE_CHECKING:
    from typing import Self

    from sandcell.client.async_transport import AsyncTransport
    from sandcell.client.transport import SyncTransport

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="SyncBound")
A = TypeVar("A", bound="AsyncBound")


def _public_signature(fn: Callable[..., Any], returns: str) -> inspect.Signature:
    """`fn`'s signature without self/cls, with `Op[X]` shown as what the caller gets."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    ret = str(sig.return_annotation)
    if ret.startswith("Op[") and ret.endswith("]"):
        ret = ret[3:-1]
    return sig.replace(parameters=params, return_annotation=returns.format(ret))


def _config_of(fn: Callable[..., Any], owner: type, args: Any, kwargs: Any) -> ClientConfig:
    bound = inspect.signature(fn).bind(owner, *args, **kwargs).arguments
    return ClientConfig.resolve(bound.get("url"), bound.get("api_key"), bound.get("config"))


class _Descriptor(Generic[P, T]):
    def __init__(self, fn: Callable[Concatenate[Any, P], Op[T]]) -> None:
        self.fn = fn
        self._signatures: dict[str, inspect.Signature] = {}
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def _wrap(self, method: Callable[..., Any], returns: str) -> Callable[..., Any]:
        """Gives the generated method the operation's name, docstring and signature."""
        functools.update_wrapper(method, self.fn)
        del method.__wrapped__  # type: ignore[attr-defined]
        if returns not in self._signatures:
            self._signatures[returns] = _public_signature(self.fn, returns)
        method.__signature__ = self._signatures[returns]  # type: ignore[attr-defined]
        return method


class operation(_Descriptor[P, T]):
    """An instance method written once as an effect generator."""

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...
    @overload
    def __get__(self, obj: SyncBound, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncBound, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return self._wrap(obj._bind(self.fn), obj._returns)


class classoperation(_Descriptor[P, T]):
    """A class method on a transport of its own, closed when the call is done."""

    @overload
    def __get__(self, obj: Any, owner: type[SyncBound]) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Any, owner: type[AsyncBound]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        cls: Any = owner or type(obj)  # a SyncBound or AsyncBound subclass
        return self._wrap(cls._bind_class(self.fn, adopt=False), cls._returns)


class constructor(_Descriptor[P, Any]):
    """A class method that returns a new object; the object keeps the transport."""

    @overload
    def __get__(self, obj: Any, owner: type[S]) -> Callable[P, S]: ...
    @overload
    def __get__(self, obj: Any, owner: type[A]) -> Callable[P, _Opening[A]]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        cls: Any = owner or type(obj)  # a SyncBound or AsyncBound subclass
        method = cls._bind_class(self.fn, adopt=True)
        return self._wrap(method, cls._constructs.format(cls.__name__))


class SyncBound:
    """Objects whose operations run on a `SyncTransport` (blocking calls)."""

    _returns = _constructs = "{}"
    _transport: SyncTransport
    _adopt: Callable[[Any, SyncTransport], Any]  # classmethod of the concrete class

    def _bind(self, fn: Callable[..., Op[T]]) -> Callable[..., T]:
        def method(*args: Any, **kwargs: Any) -> T:
            return self._transport.run(fn(self, *args, **kwargs))

        return method

    @classmethod
    def _bind_class(cls, fn: Callable[..., Op[Any]], adopt: bool) -> Callable[..., Any]:
        from sandcell.client.transport import SyncTransport

        def method(*args: Any, **kwargs: Any) -> Any:
            transport = SyncTransport(_config_of(fn, cls, args, kwargs))
            try:
                result = transport.run(fn(cls, *args, **kwargs))
            except BaseException:
                transport.close()
                raise
            if adopt:
                return cls._adopt(result, transport)
            transport.close()
            return result

        return method


class AsyncBound:
    """Objects whose operations run on an `AsyncTransport` (coroutines)."""

    _returns = "Coroutine[Any, Any, {}]"
    _constructs = "Awaitable[{}]"  # also an async context manager, see _Opening
    _transport: AsyncTransport
    _adopt: Callable[[Any, AsyncTransport], Any]

    def _bind(self, fn: Callable[..., Op[T]]) -> Callable[..., Coroutine[Any, Any, T]]:
        async def method(*args: Any, **kwargs: Any) -> T:
            return await self._transport.run(fn(self, *args, **kwargs))

        return method

    @classmethod
    def _bind_class(cls, fn: Callable[..., Op[Any]], adopt: bool) -> Callable[..., Any]:
        from sandcell.client.async_transport import AsyncTransport

        async def method(*args: Any, **kwargs: Any) -> Any:
            transport = AsyncTransport(_config_of(fn, cls, args, kwargs))
            try:
                result = await transport.run(fn(cls, *args, **kwargs))
            except BaseException:
                await transport.close()
                raise
            if adopt:
                return cls._adopt(result, transport)
            await transport.close()
            return result

        if not adopt:
            return method

        def constructing(*args: Any, **kwargs: Any) -> _Opening[Any]:
            return _Opening(method(*args, **kwargs))

        return constructing


class _Opening(Generic[A]):
    """What an async constructor returns: await it, or use it in `async with` directly."""

    def __init__(self, coro: Coroutine[Any, Any, A]) -> None:
        self._coro = coro
        self._obj: A | None = None

    def __await__(self) -> Generator[Any, None, A]:
        return self._coro.__await__()

    async def __aenter__(self) -> A:
        self._obj = await self._coro
        return await self._obj.__aenter__()  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: Any) -> Any:
        assert self._obj is not None
        return await self._obj.__aexit__(*exc)  # type: ignore[attr-defined]
