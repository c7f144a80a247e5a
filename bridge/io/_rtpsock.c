/* The RTP socket's per-packet calls, without the socket module's per-call work.
 *
 * A SIP call's media tick reads one datagram from its RTP socket with the
 * kernel's arrival time and sends one (bridge/io/legs/sip_call.py, bridge/io/ticker.py).
 * Through the socket module each of those parses its arguments, formats the
 * peer's address as text (``inet_ntop``, a ``sprintf`` in glibc), builds the
 * ancillary-data list, encodes the destination host (IDNA) and parses it back
 * (``inet_pton``), and an empty socket raises an exception. At hundreds of
 * calls that is several percent of the daemon's CPU (docs/benchmarks.md,
 * section 3, tenth pass). These two functions do the same system calls with
 * none of that:
 *
 *   recv_stamped(sock, last_key) -> (data, stamp, key, addr) | None
 *       One datagram (up to 2048 bytes), MSG_DONTWAIT. ``stamp``: the kernel's
 *       SCM_TIMESTAMPNS arrival time in CLOCK_REALTIME seconds, or -1.0 if the
 *       datagram has none. ``key``: the IPv4 source as (address << 16 | port),
 *       or -1 (any other family). ``addr``: the source as (host, port), or None
 *       when ``key`` equals ``last_key`` (the caller keeps the tuple it had).
 *       None: nothing queued. OSError: any other failure (a closed socket).
 *
 *   send_all(outbox) -> int
 *       Sends every (socket, bytes, (host, port)) of the list, back to back;
 *       returns how many failed (a full buffer, a closed socket: dropped, as
 *       RTP is). An entry this module cannot send itself (a host that is not
 *       a numeric address, data that is not bytes, an object that is not a
 *       socket, a closed socket) goes through the object's own ``sendto``.
 *
 * bridge/io/rtpsock.py holds the same two functions in Python (the fallback
 * when this module is not built) and the tests run both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_DATAGRAM 2048

static PyObject *
recv_stamped(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "recv_stamped(sock, last_key)");
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0) {  /* a closed socket's fileno() is -1: the error its recvmsg gives */
        PyErr_Clear();
        errno = EBADF;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long long last_key = PyLong_AsLongLong(args[1]);
    if (last_key == -1 && PyErr_Occurred()) {
        return NULL;
    }
    char buf[MAX_DATAGRAM];
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(sizeof(struct timespec)) + 64];
    } control;
    struct sockaddr_storage source;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_name = &source;
    msg.msg_namelen = sizeof(source);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.space;
    msg.msg_controllen = sizeof(control.space);
    ssize_t n;
    do {
        n = recvmsg(fd, &msg, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            Py_RETURN_NONE;
        }
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    double stamp = -1.0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS
            && c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof(ts));
            stamp = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
        }
    }
    long long key = -1;
    char host[INET6_ADDRSTRLEN];
    int port = 0;
    const char *text = NULL;
    if (source.ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&source;
        key = ((long long)ntohl(sin->sin_addr.s_addr) << 16) | ntohs(sin->sin_port);
        if (key != last_key) {
            text = inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
            port = ntohs(sin->sin_port);
        }
    }
    else if (source.ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)&source;
        text = inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
        port = ntohs(sin6->sin6_port);
    }
    else {
        host[0] = '\0';
        text = host;
    }
    PyObject *addr;
    if (key >= 0 && key == last_key) {
        addr = Py_NewRef(Py_None);
    }
    else {
        if (text == NULL) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        addr = Py_BuildValue("(si)", text, port);
        if (addr == NULL) {
            return NULL;
        }
    }
    PyObject *data = PyBytes_FromStringAndSize(buf, n);
    if (data == NULL) {
        Py_DECREF(addr);
        return NULL;
    }
    PyObject *stamp_obj = PyFloat_FromDouble(stamp);
    PyObject *key_obj = PyLong_FromLongLong(key);
    if (stamp_obj == NULL || key_obj == NULL) {
        Py_XDECREF(stamp_obj);
        Py_XDECREF(key_obj);
        Py_DECREF(data);
        Py_DECREF(addr);
        return NULL;
    }
    PyObject *result = PyTuple_New(4);
    if (result == NULL) {
        Py_DECREF(stamp_obj);
        Py_DECREF(key_obj);
        Py_DECREF(data);
        Py_DECREF(addr);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, data);
    PyTuple_SET_ITEM(result, 1, stamp_obj);
    PyTuple_SET_ITEM(result, 2, key_obj);
    PyTuple_SET_ITEM(result, 3, addr);
    return result;
}

/* The destination as a sockaddr, if ``addr`` is (numeric host, port). */
static int
parse_destination(PyObject *addr, struct sockaddr_storage *out, socklen_t *len)
{
    if (!PyTuple_Check(addr) || PyTuple_GET_SIZE(addr) < 2) {
        return 0;
    }
    PyObject *host = PyTuple_GET_ITEM(addr, 0);
    PyObject *port_obj = PyTuple_GET_ITEM(addr, 1);
    if (!PyUnicode_Check(host) || !PyLong_Check(port_obj)) {
        return 0;
    }
    long port = PyLong_AsLong(port_obj);
    if (port < 0 || port > 65535) {
        PyErr_Clear();
        return 0;
    }
    const char *text = PyUnicode_AsUTF8(host);
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    memset(out, 0, sizeof(*out));
    struct sockaddr_in *sin = (struct sockaddr_in *)out;
    if (inet_pton(AF_INET, text, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        *len = sizeof(*sin);
        return 1;
    }
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)out;
    if (PyTuple_GET_SIZE(addr) == 2 && inet_pton(AF_INET6, text, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*sin6);
        return 1;
    }
    return 0;  /* a name, a scoped IPv6 address, flow info: the socket module's way */
}

static PyObject *
send_all(PyObject *Py_UNUSED(module), PyObject *outbox)
{
    if (!PyList_Check(outbox)) {
        PyErr_SetString(PyExc_TypeError, "send_all(outbox): a list");
        return NULL;
    }
    Py_ssize_t failed = 0;
    /* the list is read by index each time: nothing here can change it, but the
       socket module's sendto (the fallback) runs Python code */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outbox); i++) {
        PyObject *item = PyList_GET_ITEM(outbox, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            failed++;
            continue;
        }
        PyObject *sock = PyTuple_GET_ITEM(item, 0);
        PyObject *data = PyTuple_GET_ITEM(item, 1);
        PyObject *addr = PyTuple_GET_ITEM(item, 2);
        struct sockaddr_storage dest;
        socklen_t dest_len = 0;
        int fd = -1;
        if (PyBytes_CheckExact(data) && parse_destination(addr, &dest, &dest_len)) {
            fd = PyObject_AsFileDescriptor(sock);
            if (fd < 0) {  /* closed (fileno() is -1), or not a socket: its own sendto says */
                PyErr_Clear();
            }
        }
        if (fd >= 0) {
            ssize_t sent;
            do {
                sent = sendto(fd, PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data),
                              MSG_DONTWAIT, (struct sockaddr *)&dest, dest_len);
            } while (sent < 0 && errno == EINTR);
            if (sent < 0) {
                failed++;
            }
            continue;
        }
        Py_INCREF(item);
        PyObject *r = PyObject_CallMethod(sock, "sendto", "OO", data, addr);
        Py_DECREF(item);
        if (r == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_OSError)) {
                return NULL;
            }
            PyErr_Clear();
            failed++;
        }
        else {
            Py_DECREF(r);
        }
    }
    return PyLong_FromSsize_t(failed);
}

static PyMethodDef methods[] = {
    {"recv_stamped", (PyCFunction)(void (*)(void))recv_stamped, METH_FASTCALL,
     "recv_stamped(sock, last_key) -> (data, stamp, key, addr) | None"},
    {"send_all", (PyCFunction)send_all, METH_O,
     "send_all(outbox) -> number of datagrams that failed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_rtpsock",
    .m_doc = "The RTP socket's per-packet calls (bridge/io/rtpsock.py).",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__rtpsock(void)
{
    return PyModule_Create(&module_def);
}
