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

type Response = axum::response::Response;
type CallFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;
type CallFn = dyn Fn(http::Request<Body>) -> CallFuture + Send + Sync;

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
                        Box::pin(svc.call(req).map_ok(IntoResponse::into_response))
                    }
                    Poll::Ready(Err(e)) => match e {},
                    Poll::Pending => Box::pin(async move {
                        let res = svc.oneshot(req).await?;
                        Ok(res.into_response())
                    }),
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
        Box::pin(async move {
            let res = routes.oneshot(req).await?;
            Ok(res.map(axum::body::Body::new))
        })
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

    #[tokio::test]
    async fn foreign_routes_leave_every_call_to_the_router() {
        assert!(
            Services::foreign(Routes::new(Named("router")))
                .direct()
                .is_none()
        );
    }
}
