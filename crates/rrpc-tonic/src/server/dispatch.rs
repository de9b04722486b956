//! The fast path's own dispatch: a call goes straight to its service.
//!
//! tonic's [`Routes`] is an axum router: each call is matched against its
//! route patterns, its request and response bodies are boxed into axum's
//! and back, and the matched route's boxed service is cloned. For the few
//! services a gRPC server has, all that is needed is the service whose
//! name prefixes the path (`/helloworld.Greeter/SayHello` →
//! `helloworld.Greeter`). [`Services`] keeps, beside the router, each
//! service that [`crate::Server`] was given, by name; [`Direct`] calls it, and
//! hands every other path (and every call of a server built from foreign
//! [`Routes`]) to the router, so what a client sees is what tonic's router
//! would answer.
//!
//! Used only when no server-wide layer is set: a layer wraps the router as a
//! whole, so then the fast path calls `layer(router)` as tonic does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::IntoResponse;
use futures_util::TryFutureExt;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::Routes;
use tower::{Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Response = http::Response<AnyBody>;
/// The future of a service tonic generated (its `BoxFuture`).
type TonicFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;
/// The future of any other service, or of the router.
type AxumFuture =
    Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;
type CallFn = dyn Fn(http::Request<Body>) -> CallFuture + Send + Sync;

/// A call's future: a generated service's own, as it made it (no box around
/// its box, and its response body as it is), or one that answers an
/// `axum` response (any other service, the router).
pub(crate) enum CallFuture {
    Tonic(TonicFuture),
    Axum(AxumFuture),
}

impl Future for CallFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(match self.get_mut() {
            CallFuture::Tonic(f) => std::task::ready!(f.as_mut().poll(cx))?.map(AnyBody::Tonic),
            CallFuture::Axum(f) => std::task::ready!(f.as_mut().poll(cx))?.map(AnyBody::Axum),
        }))
    }
}

/// A response body from either kind of [`CallFuture`], unboxed.
pub(crate) enum AnyBody {
    Tonic(Body),
    Axum(axum::body::Body),
}

impl http_body::Body for AnyBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        match self.get_mut() {
            AnyBody::Tonic(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            AnyBody::Axum(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnyBody::Tonic(b) => b.is_end_stream(),
            AnyBody::Axum(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            AnyBody::Tonic(b) => b.size_hint(),
            AnyBody::Axum(b) => b.size_hint(),
        }
    }
}

/// One service by name.
#[derive(Clone)]
struct Entry {
    /// `/` + the service's full name + `/`.
    prefix: String,
    call: Arc<CallFn>,
}

/// A server's services: tonic's router, and beside it each service added
/// one by one, by name (`None` once foreign [`Routes`] are part of the
/// server: their paths are known only to their router). One value, so that
/// the two never disagree.
#[derive(Clone)]
pub(crate) struct Services {
    routes: Routes,
    table: Option<Vec<Entry>>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Services");
        d.field("routes", &self.routes);
        match &self.table {
            Some(t) => d.field(
                "by_name",
                &t.iter().map(|e| e.prefix.as_str()).collect::<Vec<_>>(),
            ),
            None => d.field("by_name", &"(foreign routes: the router dispatches)"),
        };
        d.finish()
    }
}

impl Default for Services {
    fn default() -> Self {
        Services {
            routes: Routes::default(),
            table: Some(Vec::new()),
        }
    }
}

impl Services {
    /// Ready-made routes: the router decides every call.
    pub(crate) fn foreign(routes: Routes) -> Self {
        Services {
            routes,
            table: None,
        }
    }

    /// Adds `svc` to the router and by name (the same bounds as tonic's
    /// `Routes::add_service`).
    #[must_use]
    pub(crate) fn add<S>(mut self, svc: S) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: IntoResponse,
        S::Future: Send + 'static,
    {
        if let Some(table) = &mut self.table {
            let by_name = svc.clone();
            let call = move |req: http::Request<Body>| -> CallFuture {
                let mut svc = by_name.clone();
                // A service that is ready at once (tonic's generated ones
                // always are) is called here: the future boxed is its own,
                // not one that also holds the request and the service
                // (moved whole into the box and as it runs). One that is
                // not gets a real waker from `oneshot`, which asks again.
                let mut cx = Context::from_waker(std::task::Waker::noop());
                match svc.poll_ready(&mut cx) {
                    Poll::Ready(Ok(())) => {
                        // A generated service's future is already a box of
                        // the type the table wants.
                        let mut fut = Some(svc.call(req));
                        let any: &mut dyn std::any::Any = &mut fut;
                        if let Some(f) = any.downcast_mut::<Option<TonicFuture>>()
                            && let Some(f) = f.take()
                        {
                            return CallFuture::Tonic(f);
                        }
                        // Taken above only when it was one.
                        let Some(fut) = fut else {
                            let st = tonic::Status::internal("rrpc: dispatch");
                            return CallFuture::Tonic(Box::pin(std::future::ready(Ok(
                                st.into_http()
                            ))));
                        };
                        CallFuture::Axum(Box::pin(fut.map_ok(IntoResponse::into_response)))
                    }
                    Poll::Ready(Err(e)) => match e {},
                    Poll::Pending => CallFuture::Axum(Box::pin(async move {
                        let res = svc.oneshot(req).await?;
                        Ok(res.into_response())
                    })),
                }
            };
            table.push(Entry {
                prefix: format!("/{}/", S::NAME),
                call: Arc::new(call),
            });
        }
        self.routes = self.routes.add_service(svc);
        self
    }

    /// tonic's router (tonic's own server takes it).
    pub(crate) fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The service the fast path calls: the table in front of the
    /// (prepared) router, or `None` when the router must decide every call.
    pub(crate) fn direct(&self) -> Option<Direct> {
        let table = self.table.as_deref()?;
        Some(Direct {
            table: table.into(),
            routes: self.routes.clone().prepare(),
        })
    }
}

/// Calls the service a path names directly; anything else goes to the
/// router ([module docs](self)).
#[derive(Clone)]
pub(crate) struct Direct {
    table: Arc<[Entry]>,
    routes: Routes,
}

impl Direct {
    /// The entry whose service the path names, as the router's
    /// `/{name}/{*rest}` pattern matches it (the method part not empty).
    fn find(&self, path: &str) -> Option<&Entry> {
        self.table
            .iter()
            .find(|e| path.len() > e.prefix.len() && path.starts_with(e.prefix.as_str()))
    }
}

impl Service<http::Request<Body>> for Direct {
    type Response = Response;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call readies its own service (`oneshot`), as axum's routes do.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> CallFuture {
        if let Some(e) = self.find(req.uri().path()) {
            return (e.call)(req);
        }
        let routes = self.routes.clone();
        CallFuture::Axum(Box::pin(async move {
            let res = routes.oneshot(req).await?;
            Ok(res.map(axum::body::Body::new))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Named(&'static str);

    impl NamedService for Named {
        const NAME: &'static str = "test.Svc";
    }

    impl Service<http::Request<Body>> for Named {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _req: http::Request<Body>) -> Self::Future {
            let mut r = http::Response::new(Body::empty());
            r.headers_mut()
                .insert("who", http::HeaderValue::from_static(self.0));
            std::future::ready(Ok(r))
        }
    }

    fn request(path: &str) -> http::Request<Body> {
        let mut r = http::Request::new(Body::empty());
        *r.uri_mut() = path.parse().expect("path");
        r
    }

    async fn answer(d: &Direct, path: &str) -> Response {
        d.clone().oneshot(request(path)).await.expect("infallible")
    }

    #[tokio::test]
    async fn a_named_service_is_called_directly_and_the_rest_as_the_router_answers() {
        let mut services = Services::default().add(Named("direct"));
        // The same name behind the router answers otherwise: a call that
        // says "direct" did not go through it.
        services.routes = Routes::new(Named("router"));
        let d = services.direct().expect("a table");
        // The service's methods go straight to it.
        let r = answer(&d, "/test.Svc/Call").await;
        assert_eq!(r.headers()["who"], "direct");
        // Anything the router would not send to it goes to the router:
        // another service's path, the service's name with no method, a
        // prefix of its name.
        for path in ["/other.Svc/Call", "/test.Svc/", "/test.Sv/Call", "/"] {
            let r = answer(&d, path).await;
            assert!(r.headers().get("who").is_none(), "{path} was not routed");
            // tonic's fallback: UNIMPLEMENTED.
            assert_eq!(r.headers()["grpc-status"], "12", "{path}");
        }
    }

    /// A service as tonic generates it: its future is a `BoxFuture`, and
    /// it is ready only after it said `Pending` once (and woke its caller),
    /// to show the table asks again with a real waker.
    #[derive(Clone)]
    struct Generated {
        asked: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl NamedService for Generated {
        const NAME: &'static str = "test.Gen";
    }

    impl Service<http::Request<Body>> for Generated {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = TonicFuture;
        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.asked.fetch_add(1, SeqCst) == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _req: http::Request<Body>) -> Self::Future {
            let mut r = http::Response::new(Body::empty());
            r.headers_mut()
                .insert("who", http::HeaderValue::from_static("generated"));
            Box::pin(std::future::ready(Ok(r)))
        }
    }

    /// A generated service's future is handed on as it is (no box around
    /// it); a service not ready at once is asked again and then called.
    #[tokio::test]
    async fn a_generated_service_future_is_handed_on_as_it_is() {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let services = Services::default().add(Generated {
            asked: asked.clone(),
        });
        let mut d = services.direct().expect("a table");
        // Not ready at once: the call waits for it, through the router's way.
        let r = answer(&d, "/test.Gen/Call").await;
        assert_eq!(r.headers()["who"], "generated");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Ready at once: its own future.
        let fut = d.call(request("/test.Gen/Call"));
        assert!(matches!(fut, CallFuture::Tonic(_)), "boxed again");
        let r = fut.await.expect("infallible");
        assert_eq!(r.headers()["who"], "generated");
        assert!(matches!(r.body(), AnyBody::Tonic(_)), "body boxed again");
        // Any other service's answer is an axum response, as before.
        let mut d = Services::default()
            .add(Named("direct"))
            .direct()
            .expect("a table");
        let fut = d.call(request("/test.Svc/Call"));
        assert!(matches!(fut, CallFuture::Axum(_)));
        assert_eq!(fut.await.expect("infallible").headers()["who"], "direct");
    }

    #[tokio::test]
    async fn foreign_routes_leave_every_call_to_the_router() {
        assert!(
            Services::foreign(Routes::new(Named("router")))
                .direct()
                .is_none()
        );
    }
}
